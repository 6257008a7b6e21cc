"""A ZeroMQ socket that trio tasks can await, and the pub/sub endpoints, which are such a socket and no more.

trio has no native ZeroMQ support, so each socket is non-blocking and, on `zmq.Again`, waits on the socket's
FD. That FD is edge-triggered: it turns readable when the socket's event state may have changed, and reading
EVENTS resets it, so a waiter checks EVENTS before sleeping. Exactly one task may wait on an FD (a lock
serializes its users); a socket that also sends does so without ever waiting. `connect` and `send` can
consume the FD's edge too (libzmq processes pending commands there), so they wake the waiter to re-check.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import socket as plain_socket

import trio
import zmq

from streams.stats import count_received, count_sent, new_stats
from streams.wire import YIELD_EVERY, ZERO_COPY_BYTES

# the flags as plain ints: an operation on pyzmq's enum flags builds a new enum member, per message
_NOBLOCK, _SNDMORE, _POLLIN = int(zmq.NOBLOCK), int(zmq.SNDMORE), int(zmq.POLLIN)
REBIND_WAIT_S = 5.0  # how long an endpoint reopened at a given address waits for the old socket to let it go


class TrioSocket:
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
        _, waited = await self._call(functools.partial(_send_parts, self.socket, parts), zmq.POLLOUT)
        return waited

    def send_nowait(self, parts: list) -> None:
        """Send without waiting (on a socket whose queues the credit protocol bounds); raises zmq.Again."""
        _send_parts(self.socket, parts)
        if self._wait_scope is not None and self.socket.getsockopt(zmq.EVENTS) & _POLLIN:
            self.wake()  # the send may have taken the FD's edge for a message that is now waiting

    async def receive(self, before_wait=None) -> list:
        """The next message; calls ``before_wait()`` each time it is about to wait for one."""
        parts, _ = await self._call(self._receive_parts, zmq.POLLIN, before_wait)
        return parts

    def receive_nowait(self) -> list:
        """The next message waiting; zmq.Again if none is (for a socket no task is waiting on)."""
        return self._receive_parts()

    def _receive_parts(self) -> list:
        """The parts of one message (zmq.Again if none is waiting); each frame says whether more follow."""
        frame = self.socket.recv(_NOBLOCK, copy=False)
        parts = [_part(frame)]
        while frame.more:  # the rest of a message arrives with its first part
            frame = self.socket.recv(_NOBLOCK, copy=False)
            parts.append(_part(frame))
        return parts

    async def _call(self, operation, event: int, before_wait=None) -> tuple[object, float | None]:
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
                if before_wait is not None:
                    before_wait()
                await self._wait_for(event)

    async def _wait_for(self, event: int) -> None:
        while not self.socket.getsockopt(zmq.EVENTS) & event:
            with trio.CancelScope() as self._wait_scope:
                await trio.lowlevel.wait_readable(self._fd)
            self._wait_scope = None

    async def rebind(self, address: str) -> None:
        """Bind ``address`` again for a restarted endpoint: its predecessor's socket may still be lingering on it.

        TCP refuses a port in use (EADDRINUSE). A Unix socket (``ipc://``) is different: ZeroMQ removes whatever
        file is at the path and binds, even over a live socket, which would then lose its connections; and a socket
        that closes removes its file, even when a successor bound there since. So the path is bound only once no
        socket listens there and a leftover file has stayed for a poll (a closing socket removes its own)."""
        deadline = trio.current_time() + REBIND_WAIT_S
        leftover = False
        while True:
            state = _ipc_state(address.removeprefix("ipc://")) if address.startswith("ipc://") else "free"
            try:
                if state == "free" or (state == "leftover" and leftover):
                    return self.socket.bind(address)
            except zmq.ZMQError as error:
                if error.errno != zmq.EADDRINUSE:
                    raise
            leftover = state == "leftover"
            if trio.current_time() >= deadline:
                raise OSError(f"cannot bind {address}: still in use after {REBIND_WAIT_S:.0f} s")
            await trio.sleep(0.05)

    def close(self, linger_ms: int) -> None:
        trio.lowlevel.notify_closing(self._fd)
        self.socket.close(linger=linger_ms)


def _ipc_state(path: str) -> str:
    """"listening" (a socket accepts connections at ``path``), "leftover" (a file nobody listens on: a socket
    closing, or one of a process that died) or "free" (nothing there, or nothing a bind could not tell better)."""
    probe = plain_socket.socket(plain_socket.AF_UNIX, plain_socket.SOCK_STREAM)
    probe.setblocking(False)
    try:
        probe.connect(path)
        return "listening"
    except OSError as error:
        if error.errno == errno.EAGAIN:  # a listener whose queue of connections is full
            return "listening"
        return "leftover" if error.errno == errno.ECONNREFUSED else "free"
    finally:
        probe.close()


def _send_parts(socket: zmq.Socket, parts: list) -> None:
    """One message; large parts zero-copy, small ones copied (a zero-copy frame costs more than a small copy).

    The first part raises zmq.Again if the socket cannot take the message; later parts then always go.
    """
    last = len(parts) - 1
    for i, part in enumerate(parts):
        socket.send(part, _NOBLOCK | _SNDMORE if i < last else _NOBLOCK, copy=len(part) < ZERO_COPY_BYTES)


def _part(frame: zmq.Frame) -> bytes | memoryview:
    return frame.buffer.toreadonly() if len(frame) >= ZERO_COPY_BYTES else frame.bytes


class ZmqPublisher:
    """PUB: never blocks, and may drop: ZeroMQ drops silently for a full subscriber, so there is no 'dropped'
    count here; subscribers count what they miss from the frames' sequence numbers (`endpoints.Inbox`)."""

    def __init__(self, sock: TrioSocket, address: str):
        self._sock = sock
        self.address = address
        self._stats = new_stats()

    async def publish(self, topic: bytes, parts: list[bytes]) -> None:
        message = [topic, *parts]
        await self._sock.send(message)  # a PUB socket never waits: it drops instead
        count_sent(self._stats, message)

    def statistics(self) -> dict:
        return dict(self._stats)


class ZmqSubscriber:
    """SUB: receives `[topic, *parts]` for its topic prefixes from every publisher it connects to."""

    def __init__(self, sock: TrioSocket):
        self._sock = sock
        self._stats = new_stats()

    async def receive(self) -> list[bytes]:
        parts = await self._sock.receive()
        count_received(self._stats, parts)
        return parts

    def connect(self, address: str) -> None:
        self._sock.socket.connect(address)
        self._sock.wake()

    def statistics(self) -> dict:
        return dict(self._stats)
