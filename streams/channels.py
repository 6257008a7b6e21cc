"""Channels: the four kinds of stream endpoint, and the two transports that make them.

Every stream that carries data is lossless: `Sender.send` waits while its receivers are full (over ZeroMQ: while
every receiver's window of unacknowledged messages is used up), and nothing is dropped at a high-water mark; a
receiver that restarts gets again what it had not acknowledged. Only pub/sub (version announcements and weight
manifests, where the newest is what matters, and which are re-sent) may drop.

    async with transport.open_receiver() as receiver, transport.open_sender([receiver.address]) as sender:
        await sender.send(parts)
        parts = await receiver.receive()

`ZmqTransport` carries them over ZeroMQ sockets (TCP, or Unix sockets in a private directory on one host); `MemoryTransport` over in-memory queues, for the
in-process mode where every actor runs on one trio loop. Both `open_*` methods are async context managers.

A received message is a list of parts: `bytes`, or a read-only `memoryview` (zero-copy) for a part of at
least `wire.ZERO_COPY_BYTES`. `wire.decode_frame`, `wire.unpack` and `schema.decode_table` take either.
"""

from __future__ import annotations

from typing import Protocol

from streams.memory_channels import MemoryTransport
from streams.zmq_channels import ZmqTransport

__all__ = ["MemoryTransport", "Publisher", "Receiver", "Sender", "Subscriber", "ZmqTransport"]


class Sender(Protocol):
    """PUSH-like: round-robins messages across the receivers it is connected to."""

    async def send(self, parts: list[bytes]) -> None:
        """Send one message; waits while every receiver is full (backpressure)."""

    def connect(self, address: str) -> None:
        """Add a receiver; may be called at any time (elastic scaling)."""

    def disconnect(self, address: str) -> None:
        """Stop sending to a receiver (scale-down). Its unacknowledged messages are dropped and counted."""

    async def drain(self) -> None:
        """Wait until every message sent has been acknowledged by its receiver."""

    def statistics(self) -> dict:
        """Every key of `stats.STREAM_KEYS`: sent, bytes_sent, in_flight, send_waits, wait_s (waiting for credit)..."""


class Receiver(Protocol):
    """PULL-like: bound at `address`, fair-queued from all senders. Opened with ``ack_when_done=True``, a message is
    acknowledged only once the actor asks for the next; with ``ack_when_done="explicit"``, `receive` gives
    ``(parts, token)`` and a message is acknowledged only once the actor calls ``done(token)``, in any order, each
    sender's up to its oldest not done (ZeroMQ, `zmq_receiver`; in memory nothing is acknowledged late, and
    ``done`` does nothing)."""

    address: str
    explicit: bool  # opened with ack_when_done="explicit"

    async def receive(self) -> list[bytes]:
        """The parts of the next message; waits for one. Never raises on what a peer sent (ZeroMQ: it is rejected).
        ``(parts, token)`` where ``explicit``."""

    def done(self, token) -> None:
        """``explicit``: the actor is through with the message ``token`` came with (kept it or passed it on)."""

    def statistics(self) -> dict:
        """Every key of `stats.STREAM_KEYS`: received, bytes_received, dropped, duplicates, gaps, in_flight...;
        over ZeroMQ also ``rejected``: the messages it dropped, by reason (`zmq_receiver`)."""


class Publisher(Protocol):
    """PUB-like: bound at `address`; never blocks."""

    address: str

    async def publish(self, topic: bytes, parts: list[bytes]) -> None:
        """Deliver `[topic, *parts]` to every subscriber with a matching topic prefix; drop for a full one."""

    def statistics(self) -> dict:
        """sent, bytes_sent, and dropped where the transport can know (memory: yes; ZeroMQ: no, and its
        subscribers' `endpoints.Inbox` counts the frames they missed instead)."""


class Subscriber(Protocol):
    """SUB-like: receives from every publisher it connects to, for its topic prefixes."""

    async def receive(self) -> list[bytes]:
        """`[topic, *parts]` of the next message."""

    def connect(self, address: str) -> None:
        """Add a publisher; may be called at any time."""

    def statistics(self) -> dict:
        """received, bytes_received (every key of `stats.STREAM_KEYS`)."""
