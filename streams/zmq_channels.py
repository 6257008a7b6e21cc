"""ZeroMQ channels driven from trio (see `channels` for the interface and the guarantees).

trio has no native ZeroMQ support, so each socket is non-blocking and, on `zmq.Again`, waits on the socket's
FD. That FD is edge-triggered: it turns readable when the socket's event state may have changed, and reading
EVENTS resets it, so a waiter checks EVENTS before sleeping. Exactly one task may wait on an FD (a lock
serializes its users); a socket that also sends does so without ever waiting. `connect` and `send` can
consume the FD's edge too (libzmq processes pending commands there), so they wake the waiter to re-check.

Senders and receivers speak a small credit protocol over DEALER -> ROUTER (`wire.encode_link`). A sender
keeps one DEALER socket per receiver and numbers its messages per link; it may have at most `window`
messages unacknowledged on a link (the smaller of its own and the receiver's capacity; its own until the
receiver's first acknowledgement says), and waits for credit when every link is full. A receiver acknowledges what it has handed to its actor: every half
window, and always before it waits for more. A receiver opened with ``ack_when_done`` hands a message over
unacknowledged and counts it done only when its actor asks for the next one: an actor that keeps what it receives
(replay spills it to disk) or passes it on (reward, once the next actor has acknowledged it) loses nothing
acknowledged when it is killed, and its successor is sent again what it had not finished (and, if the connection
dropped while the last acknowledgement was on its way, the message before it: such consumers drop copies by id). Nothing is dropped at a high-water mark (the credits bound
every queue). When a link's connection drops (the receiver restarted, or the network failed), the sender
opens a fresh socket and sends again everything not yet acknowledged; the receiver drops (and counts) what
it already delivered, so nothing acknowledged is lost and nothing is delivered twice.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import logging
import os
from dataclasses import dataclass

import trio
import zmq

from streams.stats import new_stats
from streams.wire import (
    MAX_FRAME_BYTES, ZERO_COPY_BYTES, DropLog, FrameError, LinkType, decode_link, encode_link,
)

log = logging.getLogger(__name__)

YIELD_EVERY = 16
SENDER_LINGER_S = 1.0  # on a clean close, a sender waits this long for its messages to be acknowledged
RECEIVER_LINGER_MS = 500  # on close, a receiver's last acknowledgements get this long to go out
STALLED_RETRY_S = 0.2  # a link whose socket had no peer to take a message reopens after this long
REBIND_WAIT_S = 5.0  # how long an endpoint reopened at a given address waits for the old socket to let it go
SOCKET_SLACK_BYTES = 2**20  # ZeroMQ disconnects a peer whose message part exceeds MAX_FRAME_BYTES + this


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
        _, waited = await self._call(functools.partial(_send_parts, self.socket, parts), zmq.POLLOUT)
        return waited

    def send_nowait(self, parts: list) -> None:
        """Send without waiting (on a socket whose queues the credit protocol bounds); raises zmq.Again."""
        _send_parts(self.socket, parts)
        if self._wait_scope is not None and self.socket.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            self.wake()  # the send may have taken the FD's edge for a message that is now waiting

    async def receive(self, before_wait=None) -> list:
        """The next message; calls ``before_wait()`` each time it is about to wait for one."""
        receive = functools.partial(self.socket.recv_multipart, zmq.NOBLOCK, copy=False)
        frames, _ = await self._call(receive, zmq.POLLIN, before_wait)
        return [_part(frame) for frame in frames]

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

    def close(self, linger_ms: int) -> None:
        trio.lowlevel.notify_closing(self._fd)
        self.socket.close(linger=linger_ms)


def _send_parts(socket: zmq.Socket, parts: list) -> None:
    """One message; large parts zero-copy, small ones copied (a zero-copy frame costs more than a small copy).

    The first part raises zmq.Again if the socket cannot take the message; later parts then always go.
    """
    last = len(parts) - 1
    for i, part in enumerate(parts):
        flags = zmq.NOBLOCK | (zmq.SNDMORE if i < last else 0)
        socket.send(part, flags, copy=len(part) < ZERO_COPY_BYTES)


def _part(frame: zmq.Frame) -> bytes | memoryview:
    return frame.buffer.toreadonly() if len(frame) >= ZERO_COPY_BYTES else frame.bytes


def _nbytes(parts) -> int:
    return sum(len(part) for part in parts)


def _check_sizes(parts) -> None:
    for part in parts:
        if len(part) > MAX_FRAME_BYTES:
            raise FrameError(f"message part of {len(part)} bytes exceeds the limit of {MAX_FRAME_BYTES}", "oversized")


async def _cancel_after(scope: trio.CancelScope, wait) -> None:
    await wait()
    scope.cancel()


class _Link:
    """One sender's connection to one receiver: a DEALER socket of its own, the messages not yet acknowledged."""

    def __init__(self, address: str, capacity: int):
        self.address, self.capacity = address, capacity
        self.window = capacity  # until the receiver says how many it takes
        self.unacked: dict[int, list] = {}  # seq -> message, oldest first
        self.next_seq = 0
        self.sock: _TrioSocket | None = None  # None while (re)opening: messages wait in `unacked`
        self.scope = trio.CancelScope()
        self.stalled = trio.Event()  # set when the socket had no peer to take a message: reopen, send again

    def has_credit(self) -> bool:
        return len(self.unacked) < self.window

    def send(self, parts: list) -> None:
        message = [encode_link(LinkType.DATA, self.next_seq), *parts]
        self.unacked[self.next_seq] = message
        self.next_seq += 1
        if self.sock is not None and not self.stalled.is_set():
            self._send(message)

    def resend(self) -> None:
        for message in self.unacked.values():
            if not self._send(message):
                return

    def _send(self, message: list) -> bool:
        """Hand a message to the socket. A socket with no connected peer (one that refused the handshake,
        say) cannot take it: the message stays unacknowledged and goes again on the next connection."""
        try:
            self.sock.send_nowait(message)
            return True
        except zmq.Again:
            self.stalled.set()
            return False

    def acknowledged(self, seq: int, window: int) -> None:
        """Every message before ``seq`` was delivered; the receiver takes ``window`` unacknowledged."""
        while self.unacked and (oldest := next(iter(self.unacked))) < seq:
            del self.unacked[oldest]
        self.window = max(1, min(self.capacity, window))


class ZmqSender:
    """Round-robins messages across its receivers, at most `window` unacknowledged on each; never drops."""

    def __init__(self, transport: ZmqTransport, nursery: trio.Nursery, capacity: int):
        self._transport, self._nursery, self._capacity = transport, nursery, capacity
        self.identity = os.urandom(12).hex().encode()  # this sender's incarnation, its routing id everywhere
        self._links: dict[str, _Link] = {}
        self._next = 0
        self._credit = trio.lowlevel.ParkingLot()  # senders waiting for an acknowledgement, or a receiver
        self._calls = 0
        self._stats = new_stats()
        self._drops = DropLog(f"sender {self.identity.decode()}")

    async def send(self, parts: list[bytes]) -> None:
        _check_sizes(parts)
        await trio.lowlevel.checkpoint_if_cancelled()
        link, started = self._pick(), None
        try:
            while link is None:
                if started is None:
                    started = trio.current_time()
                    self._stats["send_waits"] += 1
                await self._credit.park()
                link = self._pick()
        finally:  # a wait that was cancelled counts too
            if started is not None:
                self._stats["wait_s"] += trio.current_time() - started
        link.send(parts)
        self._stats["sent"] += 1
        self._stats["bytes_sent"] += _nbytes(parts)
        self._calls += 1
        if self._calls % YIELD_EVERY == 0:
            await trio.lowlevel.cancel_shielded_checkpoint()

    def _pick(self) -> _Link | None:
        links = list(self._links.values())
        for step in range(len(links)):
            link = links[(self._next + step) % len(links)]
            if link.has_credit():
                self._next = (self._next + step + 1) % len(links)
                return link
        return None

    def connect(self, address: str) -> None:
        if address in self._links:
            return
        link = self._links[address] = _Link(address, self._capacity)
        self._nursery.start_soon(self._run_link, link)
        self._credit.unpark_all()

    def disconnect(self, address: str) -> None:
        """Stop sending to a receiver (scale-down). Its unacknowledged messages are dropped and counted."""
        link = self._links.pop(address)
        link.scope.cancel()
        self._stats["dropped"] += len(link.unacked)

    async def drain(self) -> None:
        """Wait until every message sent has been acknowledged."""
        while any(link.unacked for link in self._links.values()):
            await self._credit.park()

    async def _run_link(self, link: _Link) -> None:
        with link.scope:
            while True:
                async with self._transport.open_link(link.address, self.identity) as (sock, disconnected):
                    link.sock, link.stalled = sock, trio.Event()
                    link.resend()
                    try:
                        async with trio.open_nursery() as nursery:
                            nursery.start_soon(self._read_acks, link, sock)
                            nursery.start_soon(_cancel_after, nursery.cancel_scope, disconnected.receive)
                            nursery.start_soon(_cancel_after, nursery.cancel_scope, link.stalled.wait)
                    finally:
                        link.sock = None
                self._stats["reconnects"] += 1
                log.info("link to %s dropped; resending %d unacknowledged messages", link.address, len(link.unacked))
                if link.stalled.is_set():
                    await trio.sleep(STALLED_RETRY_S)  # a peer that takes nothing is not retried in a tight loop

    async def _read_acks(self, link: _Link, sock: _TrioSocket) -> None:
        while True:
            frames = await sock.receive()
            try:
                kind, seq, window = decode_link(frames[0]) if len(frames) == 1 else (None, 0, 0)
                if kind is not LinkType.ACK:
                    raise FrameError(f"expected an acknowledgement, got {len(frames)} parts", "wrong_kind")
            except FrameError as error:
                self._drops.drop(error.reason, error)
                continue
            link.acknowledged(seq, window)
            self._credit.unpark_all()

    def statistics(self) -> dict:
        in_flight = sum(len(link.unacked) for link in self._links.values())
        return {**self._stats, "in_flight": in_flight, "dropped": self._stats["dropped"] + self._drops.total()}


@dataclass
class _Peer:
    """What a receiver knows of one sender: the next sequence number it expects, what it has not acknowledged."""

    next_seq: int
    unacked: int = 0
    ack_due: bool = False


class ZmqReceiver:
    """Bound at `address`, fair-queued from all senders; acknowledges what it hands over, drops duplicates."""

    def __init__(self, sock: _TrioSocket, address: str, capacity: int, ack_when_done: bool = False):
        self._sock = sock
        self.address = address
        self._capacity = capacity
        self._ack_every = max(1, capacity // 2)
        self._ack_when_done = ack_when_done
        self._handed: tuple[bytes, int] | None = None  # ack_when_done: (sender, seq) the actor is working on
        self._peers: dict[bytes, _Peer] = {}
        self._stats = new_stats()
        self._drops = DropLog(f"receiver {address}")

    async def receive(self) -> list[bytes]:
        if self._handed is not None:  # asking for the next: the actor is done with the last one
            self._done(self._handed[0])
            self._handed = None
        while True:
            parts = self._accept(await self._sock.receive(before_wait=self.flush_acks))
            if parts is not None:
                self._stats["received"] += 1
                self._stats["bytes_received"] += _nbytes(parts)
                return parts

    def _accept(self, frames: list) -> list | None:
        """The message's parts, or None for a duplicate or a message that is not on the link protocol."""
        try:
            if len(frames) < 3:
                raise FrameError(f"message of {len(frames) - 1} parts, expected a link envelope and a body")
            kind, seq, _ = decode_link(frames[1])
            if kind is not LinkType.DATA:
                raise FrameError(f"a link {kind.name} message where data was expected", "wrong_kind")
        except FrameError as error:
            self._drops.drop(error.reason, error)
            return None
        identity = bytes(frames[0])
        peer = self._peers.setdefault(identity, _Peer(next_seq=seq))
        if seq < peer.next_seq:  # sent again after a reconnect: delivered already
            self._stats["duplicates"] += 1
            peer.ack_due = True
            return None
        self._stats["gaps"] += seq - peer.next_seq
        peer.next_seq = seq + 1
        if self._ack_when_done:
            self._handed = (identity, seq)
        else:
            self._done(identity)
        return frames[2:]

    def _done(self, identity: bytes) -> None:
        peer = self._peers[identity]
        peer.unacked += 1
        if peer.unacked >= self._ack_every:
            self._ack(identity, peer)

    def _ack(self, identity: bytes, peer: _Peer, upto: int | None = None) -> None:
        """Acknowledge every message from ``identity`` before ``upto`` (default: all it handed over)."""
        upto = peer.next_seq if upto is None else upto
        with contextlib.suppress(zmq.Again):  # a full pipe to a vanished peer: it resends, we ack again
            self._sock.send_nowait([identity, encode_link(LinkType.ACK, upto, self._capacity)])
        peer.unacked, peer.ack_due = 0, False

    def flush_acks(self) -> None:
        """Acknowledge what the actor is done with (on close, the message it is working on is not)."""
        handed, seq = self._handed or (None, None)
        for identity, peer in self._peers.items():
            if identity == handed:
                self._ack(identity, peer, upto=seq)
            elif peer.unacked or peer.ack_due:
                self._ack(identity, peer)

    def statistics(self) -> dict:
        in_flight = sum(peer.unacked for peer in self._peers.values())
        return {**self._stats, "in_flight": in_flight, "dropped": self._drops.total()}


class ZmqPublisher:
    """PUB: never blocks, and may drop: ZeroMQ drops silently for a full subscriber, so there is no 'dropped'
    count here; subscribers count what they miss from the frames' sequence numbers (`endpoints.Inbox`)."""

    def __init__(self, sock: _TrioSocket, address: str):
        self._sock = sock
        self.address = address
        self._stats = new_stats()

    async def publish(self, topic: bytes, parts: list[bytes]) -> None:
        await self._sock.send([topic, *parts])  # a PUB socket never waits: it drops instead
        self._stats["sent"] += 1
        self._stats["bytes_sent"] += len(topic) + _nbytes(parts)

    def statistics(self) -> dict:
        return dict(self._stats)


class ZmqSubscriber:
    """SUB: receives `[topic, *parts]` for its topic prefixes from every publisher it connects to."""

    def __init__(self, sock: _TrioSocket):
        self._sock = sock
        self._stats = new_stats()

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


@dataclass(frozen=True)
class CurveKeys:
    """A cluster's CURVE keys (Z85): one pair for the binding side (receivers, publishers), one for the
    connecting side (senders, subscribers). Only clients whose public key is in ``authorized_dir`` may connect.

    Make them once with `CurveKeys.create(directory)` and give every machine of the cluster a copy.
    """

    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes
    authorized_dir: str

    @classmethod
    def create(cls, directory: str) -> CurveKeys:
        import zmq.auth

        os.makedirs(directory, exist_ok=True)
        for name in ("server", "client"):
            zmq.auth.create_certificates(directory, name)
        return cls.load(directory)

    @classmethod
    def load(cls, directory: str) -> CurveKeys:
        import zmq.auth

        server = zmq.auth.load_certificate(os.path.join(directory, "server.key_secret"))
        client = zmq.auth.load_certificate(os.path.join(directory, "client.key_secret"))
        return cls(*server, *client, authorized_dir=directory)


async def _rebind(socket: zmq.Socket, address: str) -> None:
    """Bind ``address`` again for a restarted endpoint: its predecessor's socket may still be lingering on it."""
    deadline = trio.current_time() + REBIND_WAIT_S
    while True:
        try:
            return socket.bind(address)
        except zmq.ZMQError as error:
            if error.errno != zmq.EADDRINUSE:
                raise
            if trio.current_time() >= deadline:
                raise OSError(f"cannot bind {address}: still in use after {REBIND_WAIT_S:.0f} s") from error
        await trio.sleep(0.05)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # an interface name or a wildcard: not loopback
        return False


class ZmqTransport:
    """Channels over ZeroMQ TCP sockets. Receivers and publishers bind `tcp://host:<random port>`.

    `host` is loopback unless the config names another interface; binding beyond loopback requires `curve`
    keys, which encrypt every stream and admit only clients holding the cluster's client key.

    A sender's `capacity` is its window per receiver, a receiver's the window it grants each sender (the
    smaller wins). A publisher's and a subscriber's `capacity` are their high-water marks: pub/sub may drop.
    """

    def __init__(self, host: str = "127.0.0.1", context: zmq.Context | None = None, curve: CurveKeys | None = None,
                 rebind: list[str] = ()):
        if not is_loopback(host) and curve is None:
            raise ValueError(f"binding streams to {host!r}, beyond loopback, requires CURVE keys "
                             "(streams.curve_dir; see README, 'Security')")
        self.host = host
        self.context = context or zmq.Context.instance()
        self.curve = curve
        self._authenticator = None
        # A restarted actor binds its predecessor's addresses, in the order it binds (an actor binds its
        # endpoints in the same order every time it starts): whoever sent to it reconnects by itself.
        self._rebind = list(rebind)
        self.bound: list[str] = []  # every address bound, in order: what a restart passes as ``rebind``

    @contextlib.asynccontextmanager
    async def open_receiver(self, capacity: int = 64, address: str | None = None, ack_when_done: bool = False):
        options = {zmq.RCVHWM: 0, zmq.SNDHWM: 0, zmq.ROUTER_HANDOVER: 1}
        async with self._open(zmq.ROUTER, options, RECEIVER_LINGER_MS, server=True) as sock:
            receiver = ZmqReceiver(sock, await self._bind(sock, address), capacity, ack_when_done)
            try:
                yield receiver
            finally:  # acknowledge what the actor got, so that a successor is not sent it again
                receiver.flush_acks()

    @contextlib.asynccontextmanager
    async def open_sender(self, addresses: list[str] = (), capacity: int = 64):
        async with trio.open_nursery() as nursery:
            sender = ZmqSender(self, nursery, capacity)
            for address in addresses:
                sender.connect(address)
            yield sender
            with trio.move_on_after(SENDER_LINGER_S):
                await sender.drain()
            nursery.cancel_scope.cancel()

    @contextlib.asynccontextmanager
    async def open_link(self, address: str, identity: bytes):
        """A sender's DEALER socket to one receiver, and a socket that gets a message when it disconnects."""
        options = {zmq.ROUTING_ID: identity, zmq.SNDHWM: 0, zmq.RCVHWM: 0}
        async with self._open(zmq.DEALER, options, linger_ms=0, server=False) as sock:
            monitor = _TrioSocket(sock.socket.get_monitor_socket(zmq.EVENT_DISCONNECTED))
            sock.socket.connect(address)
            try:
                yield sock, monitor
            finally:
                sock.socket.disable_monitor()
                monitor.close(0)

    @contextlib.asynccontextmanager
    async def open_publisher(self, capacity: int = 4, address: str | None = None):
        async with self._open(zmq.PUB, {zmq.SNDHWM: capacity}, linger_ms=0, server=True) as sock:
            yield ZmqPublisher(sock, await self._bind(sock, address))

    @contextlib.asynccontextmanager
    async def open_subscriber(
        self, addresses: list[str] = (), topics: list[bytes] = (b"",), capacity: int = 4
    ):
        async with self._open(zmq.SUB, {zmq.RCVHWM: capacity}, linger_ms=0, server=False) as sock:
            for topic in topics:
                sock.socket.setsockopt(zmq.SUBSCRIBE, topic)
            subscriber = ZmqSubscriber(sock)
            for address in addresses:
                subscriber.connect(address)
            yield subscriber

    @contextlib.asynccontextmanager
    async def _open(self, kind: int, options: dict, linger_ms: int, server: bool):
        socket = self.context.socket(kind)
        socket.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES + SOCKET_SLACK_BYTES)  # a peer sending more is cut off
        for option, value in options.items():
            socket.setsockopt(option, value)
        if self.curve is not None:
            self._secure(socket, server)
        sock = _TrioSocket(socket)
        try:
            yield sock
        finally:
            sock.close(linger_ms)

    def _secure(self, socket: zmq.Socket, server: bool) -> None:
        keys = self.curve
        if server:
            if self._authenticator is None:
                from zmq.auth.thread import ThreadAuthenticator

                self._authenticator = ThreadAuthenticator(self.context)
                self._authenticator.start()
                self._authenticator.configure_curve(domain="*", location=keys.authorized_dir)
            socket.curve_server = True
            socket.curve_publickey, socket.curve_secretkey = keys.server_public, keys.server_secret
        else:
            socket.curve_serverkey = keys.server_public
            socket.curve_publickey, socket.curve_secretkey = keys.client_public, keys.client_secret

    async def _bind(self, sock: _TrioSocket, address: str | None) -> str:
        if address is None and self._rebind:
            address = self._rebind.pop(0)
        if address is None:
            sock.socket.bind(f"tcp://{self.host}:*")
        else:
            await _rebind(sock.socket, address)
        sock.wake()
        self.bound.append(sock.socket.getsockopt_string(zmq.LAST_ENDPOINT))
        return self.bound[-1]
