"""ReplayActor: a FIFO of scored episodes that cuts them into training batches of whole episodes.

The buffer is bounded: when it is full the actor stops reading, and the backpressure reaches the env
actors, which then start no new episodes. Nothing is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import trio

from actors.endpoints import Inbox, Outbox
from streams.schema import decode_table, encode_table
from streams.wire import Kind


@dataclass
class ReplayConfig:
    batch_episodes: int = 64
    capacity_episodes: int = 128


class ReplayActor:
    def __init__(self, cfg: ReplayConfig, name: str = "replay"):
        if cfg.capacity_episodes < cfg.batch_episodes:
            raise ValueError(f"replay capacity {cfg.capacity_episodes} < batch size {cfg.batch_episodes}")
        self.cfg, self.name = cfg, name
        self._stats = {"episodes_in": 0, "batches_out": 0, "episodes_out": 0}
        self._buffered = 0
        self._inbox = None

    async def run(self, transport, peers: dict, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        buffer_in, buffer_out = trio.open_memory_channel(self.cfg.capacity_episodes)
        async with (
            transport.open_receiver(capacity=16) as episodes,
            transport.open_sender(peers["learner"], capacity=1) as learner,
            trio.open_nursery() as nursery,
        ):
            self._inbox = Inbox(episodes, Kind.EPISODES, decode_table)
            nursery.start_soon(self._fill, buffer_in)
            nursery.start_soon(self._batch, buffer_out, Outbox(learner, Kind.BATCH, self.name))
            task_status.started({"episodes": episodes.address})

    async def _fill(self, buffer_in) -> None:
        while True:
            episode = await self._inbox.receive()
            await buffer_in.send(episode)
            self._buffered += 1
            self._stats["episodes_in"] += 1

    async def _batch(self, buffer_out, learner: Outbox) -> None:
        while True:
            episodes = [await buffer_out.receive() for _ in range(self.cfg.batch_episodes)]
            self._buffered -= len(episodes)
            await learner.send(encode_table(pa.concat_tables(episodes)))
            self._stats["batches_out"] += 1
            self._stats["episodes_out"] += len(episodes)

    def statistics(self) -> dict:
        dropped = self._inbox.statistics()["dropped_frames"] if self._inbox else 0
        return {**self._stats, "buffered": self._buffered, "dropped_frames": dropped}
