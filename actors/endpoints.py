"""Typed ends of streams for actors: frames out with a sequence number, frames in checked and counted.

A malformed frame (bad header, unknown kind, other version, bad body) is dropped with a log line and a
counter; it never reaches the actor's logic and is never executed.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Callable, TypeVar

from streams.schema import SchemaError
from streams.wire import FrameCounter, FrameError, Kind, decode_frame

log = logging.getLogger(__name__)
T = TypeVar("T")


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


class Inbox:
    """Receives frames of one kind and decodes their bodies with ``decode``; drops and counts bad ones."""

    def __init__(self, channel, kind: Kind, decode: Callable[[object], T], topic: bool = False):
        self.channel, self.kind, self.decode, self.topic = channel, kind, decode, topic
        self.dropped: Counter[str] = Counter()

    async def receive(self) -> T:
        while True:
            parts = await self.channel.receive()
            if self.topic:
                parts = parts[1:]
            try:
                header, body = decode_frame(parts)
                if header.kind != self.kind:
                    raise FrameError(f"frame of kind {header.kind.value!r}, expected {self.kind.value!r}")
                return self.decode(body)
            except (FrameError, SchemaError) as error:
                self.dropped[type(error).__name__] += 1
                log.warning("dropped a malformed %s frame: %s", self.kind.value, error)

    def statistics(self) -> dict:
        return {**self.channel.statistics(), "dropped_frames": sum(self.dropped.values())}
