"""What the rollout actor's two engines share: the interface the actor drives, the counts of what they serve, and
taking what is waiting in a channel."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import trio

from streams.messages import Completion, GenerationRequest

Answer = tuple[Completion, GenerationRequest]  # a completion and the request it answers (whose reply_to it goes to)


class Engine(Protocol):
    """A generation engine of the rollout actor (`HfEngine`, `VllmEngine`), chosen once when the actor starts.

    ``serve`` answers every request from ``requests`` (the live policy's and its snapshots') on ``completions``;
    ``load`` puts new weights into the engine, called by the actor's `HeldWeights` when the engine takes them."""

    tokenizer: object

    async def load(self, version: int, tensors) -> None: ...

    async def serve(self, requests: trio.MemoryReceiveChannel, completions: trio.MemorySendChannel) -> None: ...

    def statistics(self) -> dict: ...

    def close(self) -> None: ...


@dataclass
class Served:
    """What an engine served, counted by whichever of its parts served it (keys of the actor's statistics)."""

    requests: int = 0
    tokens: int = 0
    batches: int = 0  # batches the hf sampler sampled (the live policy's, or one snapshot's requests)
    generate_s: float = 0.0  # seconds it spent on them
    idle_s: float = 0.0  # seconds with nothing to serve
    refused_requests: int = 0  # refused by the vllm engine (settings outside what it accepts)


async def waiting(channel: trio.MemoryReceiveChannel, limit: int) -> list:
    """What is waiting in ``channel``, up to ``limit`` items (waits for the first)."""
    batch = [await channel.receive()]
    while len(batch) < limit:
        try:
            batch.append(channel.receive_nowait())
        except trio.WouldBlock:
            break
    return batch
