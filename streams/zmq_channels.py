"""ZeroMQ channels driven from trio (see `channels` for the interface).

trio has no native ZeroMQ support, so each socket is non-blocking and, on `zmq.Again`, waits on the socket's
FD. That FD is edge-triggered: it turns readable when the socket's event state may have changed, and reading
EVENTS resets it, so a waiter checks EVENTS before sleeping. Exactly one task may wait on an FD: each socket
carries one direction only (PUSH sends, PULL receives, ...) and a lock serializes its users. `connect` can
consume the FD's edge too (libzmq processes pending commands there), so it wakes the waiter to re-check.
"""

from __future__ import annotations

import contextlib
import functools

import trio
import zmq

from streams.wire import MAX_FRAME_BYTES, ZERO_COPY_BYTES

YIELD_EVERY = 16
SENDER_LINGER_MS = 1000  # on close, a sender gets this long to flush what it has queued


class _TrioSocket:
    """A non-blocking ZeroMQ socket that trio tasks can await."""

    def __init__(self, socket: zmq.Socket):
        self.socket = socket
        self._fd = socket.getsockopt(zmq.FD)
        self._lock = trio.Lock()  # one waiter on the FD at a time
        self._wait_scope: trio.CancelScope | None = None
        self._calls = 0

    def wake(self) -> None:
        """Make a task waiting on this socket re-read EVENTS."""
        if self._wait_scope is not None:
            self._wait_scope.cancel()

    async def send(self, parts: list) -> float | None:
        """Send one message, waiting while the peers are full. Returns seconds waited, or None."""
        send = functools.partial(self.socket.send_multipart, parts, zmq.NOBLOCK, copy=False)
        _, waited = await self._call(send, zmq.POLLOUT)
        return waited

    async def receive(self) -> list:
        receive = functools.partial(self.socket.recv_multipart, zmq.NOBLOCK, copy=False)
        frames, _ = await self._call(receive, zmq.POLLIN)
        return [_part(frame) for frame in frames]

    async def _call(self, operation, event: int) -> tuple[object, float | None]:
        """Run a non-blocking operation, waiting on the FD while it raises zmq.Again.

        Returns its result and the seconds it waited (None if it did not). Every call is a cancellation
        point, and yields to other tasks when it waits or, if it never has to, every YIELD_EVERY calls:
        yielding on every message halves the throughput.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        if not self._lock.locked():  # fast path: no task is waiting on this socket
            with contextlib.suppress(zmq.Again):
                result = operation()
                self._calls += 1
                if self._calls % YIELD_EVERY == 0:
                    await trio.lowlevel.cancel_shielded_checkpoint()  # done: must not raise now
                return result, None
        async with self._lock:
            started = trio.current_time()
            while True:
                with contextlib.suppress(zmq.Again):
                    return operation(), trio.current_time() - started
                await self._wait_for(event)

    async def _wait_for(self, event: int) -> None:
        while not self.socket.getsockopt(zmq.EVENTS) & event:
            with trio.CancelScope() as self._wait_scope:
                await trio.lowlevel.wait_readable(self._fd)
            self._wait_scope = None

    def close(self, linger_ms: int) -> None:
        trio.lowlevel.notify_closing(self._fd)
        self.socket.close(linger=linger_ms)


def _part(frame: zmq.Frame) -> bytes | memoryview:
    return frame.buffer.toreadonly() if len(frame) >= ZERO_COPY_BYTES else frame.bytes


def _nbytes(parts) -> int:
    return sum(len(part) for part in parts)


class ZmqSender:
    """PUSH: round-robins messages across connected receivers; `send` waits while they are all full."""

    def __init__(self, sock: _TrioSocket):
        self._sock = sock
        self._stats = dict(sent=0, bytes_sent=0, send_waits=0, wait_s=0.0)

    async def send(self, parts: list[bytes]) -> None:
        waited = await self._sock.send(parts)
        if waited is not None:
            self._stats["send_waits"] += 1
            self._stats["wait_s"] += waited
        self._stats["sent"] += 1
        self._stats["bytes_sent"] += _nbytes(parts)

    def connect(self, address: str) -> None:
        self._sock.socket.connect(address)
        self._sock.wake()

    def disconnect(self, address: str) -> None:
        """Stop sending to a receiver (scale-down). Messages already queued for it may be lost."""
        self._sock.socket.disconnect(address)
        self._sock.wake()

    def statistics(self) -> dict:
        return dict(self._stats)


class ZmqReceiver:
    """PULL: bound at `address`, fair-queued from all senders."""

    def __init__(self, sock: _TrioSocket, address: str):
        self._sock = sock
        self.address = address
        self._stats = dict(received=0, bytes_received=0)

    async def receive(self) -> list[bytes]:
        parts = await self._sock.receive()
        self._stats["received"] += 1
        self._stats["bytes_received"] += _nbytes(parts)
        return parts

    def statistics(self) -> dict:
        return dict(self._stats)


class ZmqPublisher:
    """PUB: never blocks. ZeroMQ drops silently for a full subscriber, so there is no 'dropped' count."""

    def __init__(self, sock: _TrioSocket, address: str):
        self._sock = sock
        self.address = address
        self._stats = dict(published=0, bytes_published=0)

    async def publish(self, topic: bytes, parts: list[bytes]) -> None:
        await self._sock.send([topic, *parts])  # a PUB socket never waits: it drops instead
        self._stats["published"] += 1
        self._stats["bytes_published"] += len(topic) + _nbytes(parts)

    def statistics(self) -> dict:
        return dict(self._stats)


class ZmqSubscriber:
    """SUB: receives `[topic, *parts]` for its topic prefixes from every publisher it connects to."""

    def __init__(self, sock: _TrioSocket):
        self._sock = sock
        self._stats = dict(received=0, bytes_received=0)

    async def receive(self) -> list[bytes]:
        parts = await self._sock.receive()
        self._stats["received"] += 1
        self._stats["bytes_received"] += _nbytes(parts)
        return parts

    def connect(self, address: str) -> None:
        self._sock.socket.connect(address)
        self._sock.wake()

    def statistics(self) -> dict:
        return dict(self._stats)


class ZmqTransport:
    """Channels over ZeroMQ TCP sockets. Receivers and publishers bind `tcp://host:<random port>`.

    `capacity` is the socket's high-water mark in messages; between a sender and a receiver up to
    SNDHWM + RCVHWM messages (plus what the kernel's TCP buffers hold) are in flight.
    """

    def __init__(self, host: str = "127.0.0.1", context: zmq.Context | None = None):
        self.host = host
        self.context = context or zmq.Context.instance()

    @contextlib.asynccontextmanager
    async def open_receiver(self, capacity: int = 64, address: str | None = None):
        async with self._open(zmq.PULL, {zmq.RCVHWM: capacity}, linger_ms=0) as sock:
            yield ZmqReceiver(sock, self._bind(sock, address))

    @contextlib.asynccontextmanager
    async def open_sender(self, addresses: list[str] = (), capacity: int = 64):
        async with self._open(zmq.PUSH, {zmq.SNDHWM: capacity}, SENDER_LINGER_MS) as sock:
            sender = ZmqSender(sock)
            for address in addresses:
                sender.connect(address)
            yield sender

    @contextlib.asynccontextmanager
    async def open_publisher(self, capacity: int = 4, address: str | None = None):
        async with self._open(zmq.PUB, {zmq.SNDHWM: capacity}, linger_ms=0) as sock:
            yield ZmqPublisher(sock, self._bind(sock, address))

    @contextlib.asynccontextmanager
    async def open_subscriber(
        self, addresses: list[str] = (), topics: list[bytes] = (b"",), capacity: int = 4
    ):
        async with self._open(zmq.SUB, {zmq.RCVHWM: capacity}, linger_ms=0) as sock:
            for topic in topics:
                sock.socket.setsockopt(zmq.SUBSCRIBE, topic)
            subscriber = ZmqSubscriber(sock)
            for address in addresses:
                subscriber.connect(address)
            yield subscriber

    @contextlib.asynccontextmanager
    async def _open(self, kind: int, options: dict, linger_ms: int):
        socket = self.context.socket(kind)
        socket.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)  # a peer sending more is disconnected
        for option, value in options.items():
            socket.setsockopt(option, value)
        sock = _TrioSocket(socket)
        try:
            yield sock
        finally:
            sock.close(linger_ms)

    def _bind(self, sock: _TrioSocket, address: str | None) -> str:
        sock.socket.bind(address or f"tcp://{self.host}:*")
        sock.wake()
        return sock.socket.getsockopt_string(zmq.LAST_ENDPOINT)
