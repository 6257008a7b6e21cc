"""In-memory channels for the in-process mode, where every actor runs on one trio loop (see `channels`).

They mirror the ZeroMQ channels: a bounded queue (a "mailbox") per receiver address, senders round-robin over
their addresses skipping full mailboxes and wait when all are full (the room in a mailbox plays the part of
ZeroMQ's credits; nothing is lost in memory, so there is nothing to acknowledge or send again), a send or receive
that need not wait yields once every ``YIELD_EVERY`` calls (each is a cancellation point), publishers
drop for a full subscriber and count it. A sender may connect to an address before anything is bound there: messages queue at that address
(up to the capacity) and are delivered once a receiver binds it, as ZeroMQ does. Addresses are only known
within one MemoryTransport: the in-process mode shares one instance between all actors.
"""

from __future__ import annotations

import contextlib
import itertools
from collections import defaultdict, deque

import trio

from streams.stats import count_received, count_sent, new_stats
from streams.wire import YIELD_EVERY, ZERO_COPY_BYTES


class _Mailbox:
    """A bounded FIFO of messages at one address."""

    def __init__(self, capacity: int, space_freed: trio.lowlevel.ParkingLot | None = None):
        self.capacity = capacity
        self._queue: deque[list] = deque()
        self._nonempty = trio.lowlevel.ParkingLot()
        self._space_freed = space_freed
        self._gets = 0

    def put_nowait(self, parts: list) -> bool:
        if len(self._queue) >= self.capacity:
            return False
        self._queue.append(parts)
        self._nonempty.unpark()
        return True

    async def get(self) -> list:
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._queue:
            self._gets += 1
            if self._gets % YIELD_EVERY == 0:
                await trio.lowlevel.cancel_shielded_checkpoint()
        while not self._queue:
            await self._nonempty.park()
        if self._space_freed is not None:
            self._space_freed.unpark_all()
        return self._queue.popleft()


def _shared(parts) -> list:
    """What a receiver gets: the same objects, large parts as read-only memoryviews (as ZmqReceiver does)."""
    return [memoryview(p).toreadonly() if len(p) >= ZERO_COPY_BYTES else p for p in parts]


class MemorySender:
    def __init__(self, transport: MemoryTransport, capacity: int):
        self._transport = transport
        self._capacity = capacity
        self._addresses: list[str] = []
        self._next = 0
        self._stats = new_stats()
        self._calls = 0

    async def send(self, parts: list[bytes]) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        self._calls += 1
        if self._calls % YIELD_EVERY == 0:
            await trio.lowlevel.cancel_shielded_checkpoint()
        message, started = _shared(parts), None
        while not self._put_nowait(message):
            if started is None:
                started = trio.current_time()
                self._stats["send_waits"] += 1
            await self._transport.space_freed.park()
        if started is not None:
            self._stats["wait_s"] += trio.current_time() - started
        count_sent(self._stats, parts)

    def _put_nowait(self, message: list) -> bool:
        count = len(self._addresses)
        for step in range(count):
            index = (self._next + step) % count
            if self._transport.mailbox(self._addresses[index], self._capacity).put_nowait(message):
                self._next = (index + 1) % count
                return True
        return False

    def connect(self, address: str) -> None:
        self._transport.mailbox(address, self._capacity)
        self._addresses.append(address)
        self._transport.space_freed.unpark_all()

    def disconnect(self, address: str) -> None:
        """Stop sending to a receiver (scale-down). What is queued there stays for whoever binds it."""
        self._addresses.remove(address)

    async def drain(self) -> None:
        """A message in a mailbox is delivered: nothing is ever left to wait for."""
        await trio.lowlevel.checkpoint()

    def statistics(self) -> dict:
        return dict(self._stats)


class MemoryReceiver:
    def __init__(self, mailbox: _Mailbox, address: str, explicit: bool = False):
        self._mailbox = mailbox
        self.address = address
        self.explicit = explicit  # receive gives (parts, token), as a ZeroMQ receiver's ack_when_done="explicit"
        self._tokens = itertools.count()
        self._stats = new_stats()

    async def receive(self) -> list[bytes] | tuple[list[bytes], int]:
        parts = await self._mailbox.get()
        count_received(self._stats, parts)
        return (list(parts), next(self._tokens)) if self.explicit else list(parts)

    def done(self, token: int) -> None:
        """Nothing to acknowledge in memory (see `MemoryTransport.open_receiver`)."""

    def statistics(self) -> dict:
        return dict(self._stats)


class MemoryPublisher:
    def __init__(self, transport: MemoryTransport, address: str):
        self._transport = transport
        self.address = address
        self._stats = new_stats()

    async def publish(self, topic: bytes, parts: list[bytes]) -> None:
        await trio.lowlevel.checkpoint()
        message = _shared([topic, *parts])
        for subscriber in self._transport.subscribers[self.address]:
            if subscriber.wants(topic) and not subscriber.mailbox.put_nowait(message):
                self._stats["dropped"] += 1
        count_sent(self._stats, message)

    def statistics(self) -> dict:
        return dict(self._stats)


class MemorySubscriber:
    def __init__(self, transport: MemoryTransport, topics: list[bytes], capacity: int):
        self._transport = transport
        self._topics = tuple(topics)
        self.mailbox = _Mailbox(capacity)
        self._stats = new_stats()

    def wants(self, topic: bytes) -> bool:
        return any(topic.startswith(prefix) for prefix in self._topics)

    async def receive(self) -> list[bytes]:
        parts = await self.mailbox.get()
        count_received(self._stats, parts)
        return list(parts)

    def connect(self, address: str) -> None:
        self._transport.subscribers[address].append(self)

    def statistics(self) -> dict:
        return dict(self._stats)


class MemoryTransport:
    """Channels as bounded in-memory queues, with the same methods and semantics as ZmqTransport.

    A receiver's `capacity` bounds its mailbox (a sender's is used only for a mailbox it creates by connecting
    first); each subscriber holds `capacity` messages, and a publisher's `capacity` is unused.
    """

    def __init__(self):
        self.space_freed = trio.lowlevel.ParkingLot()  # senders waiting for room, or for a peer
        self.subscribers: defaultdict[str, list[MemorySubscriber]] = defaultdict(list)
        self._mailboxes: dict[str, _Mailbox] = {}
        self._bound: set[str] = set()
        self._ids = itertools.count()

    def mailbox(self, address: str, capacity: int) -> _Mailbox:
        if address not in self._mailboxes:
            self._mailboxes[address] = _Mailbox(capacity, self.space_freed)
        return self._mailboxes[address]

    def check_peer_address(self, address: str) -> None:
        """ValueError unless ``address`` is an in-memory one (as `ZmqTransport.check_peer_address`)."""
        if not address.startswith("mem://"):
            raise ValueError(f"{address[:100]!r} is not an in-memory address (mem://...)")

    @contextlib.asynccontextmanager
    async def open_receiver(self, capacity: int = 64, address: str | None = None, ack_when_done: bool | str = False,
                            max_message_bytes: int | None = None):
        # ack_when_done: in one process an actor cannot die alone, so there is nothing to acknowledge late; "explicit"
        # gives tokens as ZeroMQ's does, and done() is a no-op. max_message_bytes: nothing in memory comes from a peer
        # that could break its frames' limits
        if ack_when_done not in (False, True, "explicit"):
            raise ValueError(f"ack_when_done is False, True or 'explicit', not {ack_when_done!r}")
        address = address or f"mem://receiver-{next(self._ids)}"
        if address in self._bound:
            raise ValueError(f"address {address} is already bound")
        mailbox = self.mailbox(address, capacity)
        mailbox.capacity = capacity
        self._bound.add(address)
        try:
            yield MemoryReceiver(mailbox, address, explicit=ack_when_done == "explicit")
        finally:
            self._bound.discard(address)

    @contextlib.asynccontextmanager
    async def open_sender(self, addresses: list[str] = (), capacity: int = 64):
        sender = MemorySender(self, capacity)
        for address in addresses:
            sender.connect(address)
        yield sender

    @contextlib.asynccontextmanager
    async def open_publisher(self, capacity: int = 4, address: str | None = None):
        address = address or f"mem://publisher-{next(self._ids)}"
        if address in self._bound:
            raise ValueError(f"address {address} is already bound")
        self._bound.add(address)
        try:
            yield MemoryPublisher(self, address)
        finally:
            self._bound.discard(address)

    @contextlib.asynccontextmanager
    async def open_subscriber(self, addresses: list[str] = (), topics: list[bytes] = (b"",), capacity: int = 4,
                              max_message_bytes: int | None = None):
        subscriber = MemorySubscriber(self, topics, capacity)
        for address in addresses:
            subscriber.connect(address)
        try:
            yield subscriber
        finally:
            for subscribers in self.subscribers.values():
                if subscriber in subscribers:
                    subscribers.remove(subscriber)
