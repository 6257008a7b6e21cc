"""Typed ends of streams for actors: frames out with a sequence number, frames in checked and counted (replies to
the addresses requests name: `replies`).

A malformed, oversized, unknown-kind, wrong-version or wrong-kind frame, or one whose body does not decode
(`bad_body`), is dropped with a log line (`wire.DropLog`) and counted by reason; it never reaches the actor's logic,
never crashes it, and is never executed or unpickled. An `Inbox` reports them, with what its transport rejected
below the frames (`zmq_receiver`), in ``statistics()["rejected"]``.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import AsyncIterator, Callable, TypeVar

from streams.wire import FRAME_LIMITS, DropLog, FrameCounter, FrameError, Kind, decode_frame

T = TypeVar("T")
_DROPPED = object()  # what `Inbox._decoded` gives for a frame it dropped


class Outbox:
    """Sends bodies of one kind on a Sender (or a Publisher, with a topic)."""

    def __init__(self, channel, kind: Kind, sender_name: str, topic: bytes | None = None):
        self.channel, self.kind, self.topic = channel, kind, topic
        self._frames = FrameCounter(sender_name)

    async def send(self, body: bytes) -> None:
        parts = self._frames.frame(self.kind, body)
        if self.topic is None:
            await self.channel.send(parts)
        else:
            await self.channel.publish(self.topic, parts)

    def statistics(self) -> dict:
        return self.channel.statistics()


@contextlib.asynccontextmanager
async def open_outboxes(transport, addresses: dict[str, list[str]], kind: Kind, sender_name: str,
                        capacity: int = 64) -> AsyncIterator[dict[str, Outbox]]:
    """One Outbox of ``kind`` per key of ``addresses`` (e.g. a learning member), each on a Sender of its own."""
    async with contextlib.AsyncExitStack() as stack:
        yield {key: Outbox(await stack.enter_async_context(transport.open_sender(to, capacity=capacity)), kind,
                           sender_name) for key, to in addresses.items()}


class Inbox:
    """Receives frames of one kind and decodes their bodies with ``decode``; drops and counts bad ones.

    On a subscription (``topic=True``, a stream that may drop) it also counts the frames it missed, from
    each sender's sequence numbers: a lossless stream counts its gaps in the transport instead.

    On a receiver opened with ``ack_when_done="explicit"`` it gives what its channel gives, ``(value, token)``, and
    the actor calls `done` with the token once it is through with the value (`zmq_receiver`); a frame it drops is
    done at once.
    """

    def __init__(self, channel, kind: Kind, decode: Callable[[object], T], topic: bool = False):
        self.channel, self.kind, self.decode, self.topic = channel, kind, decode, topic
        self.drops = DropLog(f"{kind.value} inbox")
        self._last_seq: dict[str, int] = {}  # subscriptions: the last sequence number from each sender
        self._missed = 0
        self.explicit = getattr(channel, "explicit", False)

    async def receive(self) -> T | tuple[T, object]:
        """The next value; ``(value, token)`` on an explicit-done receiver."""
        while True:
            if self.explicit:
                parts, token = await self.channel.receive()
            else:
                parts, token = await self.channel.receive(), None
            message = self._decoded(parts)
            if message is not _DROPPED:
                return (message, token) if self.explicit else message
            if self.explicit:
                self.channel.done(token)

    def done(self, token) -> None:
        """The actor is through with the value ``token`` came with (an explicit-done receiver's `done`)."""
        self.channel.done(token)

    def _decoded(self, parts: list) -> T | object:
        """The message's value, or _DROPPED (counted by reason)."""
        try:
            if self.topic:
                parts = parts[1:]
            size = sum(len(part) for part in parts)
            if size > FRAME_LIMITS[self.kind]:  # every part counts, however many there are
                raise FrameError(f"message of {len(parts)} parts and {size} bytes exceeds the {self.kind.value} "
                                 f"limit of {FRAME_LIMITS[self.kind]}", "oversized")
            header, body = decode_frame(parts)
            if header.kind != self.kind:
                raise FrameError(f"frame of kind {header.kind.value!r}, expected {self.kind.value!r}", "wrong_kind")
        except FrameError as error:
            self.drops.drop(error.reason, error)
            return _DROPPED
        except Exception as error:  # however a frame fails its checks, it is the frame's rejection
            self.drops.drop("malformed", f"{type(error).__name__}: {error}")
            return _DROPPED
        try:
            message = self.decode(body)
        except Exception as error:  # a body that does not decode, however it fails: never the actor's problem
            self.drops.drop("bad_body", error)
            return _DROPPED
        if self.topic:
            self._count_missed(header.sender, header.seq)
        return message

    def _count_missed(self, sender: str, seq: int) -> None:
        last = self._last_seq.get(sender)
        if last is not None and seq > last + 1:
            self._missed += seq - last - 1
        self._last_seq[sender] = seq  # a smaller seq: the sender restarted, and counts from 0 again

    def statistics(self) -> dict:
        stats = self.channel.statistics()
        rejected = Counter(stats.get("rejected", {})) + self.drops.counts
        return {**stats, "gaps": stats["gaps"] + self._missed, "dropped_frames": self.drops.total(),
                "dropped_by_reason": dict(self.drops.counts), "rejected": dict(rejected)}
