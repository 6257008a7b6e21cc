"""ZeroMQ channels driven from trio (see `channels` for the interface and the guarantees).

Senders and receivers speak a small credit protocol over DEALER -> ROUTER (`wire.encode_link`). A sender keeps one
DEALER socket per receiver and numbers its messages per link; it may have at most `window` messages unacknowledged
on a link (the smaller of its own and the receiver's capacity; its own until the receiver's first acknowledgement
says), and waits for credit when every link is full. A receiver acknowledges what it has handed to its actor: every
half window, and always before it waits for more. A receiver opened with ``ack_when_done`` hands a message over
unacknowledged and counts it done only when its actor asks for the next one: an actor that keeps what it receives
(replay spills it to disk) or passes it on (reward, once the next actor has acknowledged it) loses nothing
acknowledged when it is killed, and its successor is sent again what it had not finished (and, if it died before its
last acknowledgement was out, the messages that one covered: such consumers drop copies by id).
One opened with ``ack_when_done="explicit"`` hands each message with a token, and counts it done when its actor
calls ``done(token)``, in any order: an actor that holds several at once (a batching reward actor) acknowledges each
sender's up to the oldest it still holds (`zmq_receiver`).
Nothing is dropped at a high-water mark: the credits bound every queue, and a receiver's high-water marks sit
just above its window, so a peer that ignores the credits is held back by TCP, not buffered (a sender's send mark
is higher: `sender_hwm`). When a link's connection drops (the receiver restarted, or the network failed), the
sender takes the acknowledgements that arrived before the drop, opens a fresh socket and sends again everything not
yet acknowledged; the receiver drops (and counts) what it already delivered, so nothing acknowledged is lost and
nothing is delivered twice. The receiving end, and what it rejects, is `zmq_receiver`.

Every socket is a `zmq_socket.TrioSocket` (how trio waits on ZeroMQ is told there, with the pub/sub endpoints);
the CURVE keys and the rule that binding beyond loopback needs them are in `security`. A run on one host binds
Unix sockets in a private directory instead of TCP ports (`ZmqTransport`'s ``ipc_dir``): only this user can reach
them.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import re
import secrets

import trio
import zmq

from streams.private_files import check_private
from streams.security import CurveKeys, is_loopback
from streams.stats import count_sent, new_stats
from streams.wire import LINK_BYTES, MAX_FRAME_BYTES, DropLog, FrameError, LinkType, decode_link, encode_link
from streams.zmq_receiver import ZmqReceiver
from streams.zmq_socket import YIELD_EVERY, TrioSocket, ZmqPublisher, ZmqSubscriber

log = logging.getLogger(__name__)

SENDER_LINGER_S = 1.0  # on a clean close, a sender waits this long for its messages to be acknowledged
RECEIVER_LINGER_MS = 500  # on close, a receiver's last acknowledgements get this long to go out
STALLED_RETRY_S = 0.2  # a link whose socket had no peer to take a message reopens after this long
# High-water marks: a socket queues at most its credit window and this many messages more (a peer that ignores
# the credits is held back by TCP instead), so a receiver's memory is bounded by its senders' windows.
HWM_SLACK = 16
# a sender's socket takes acknowledgements only, a publisher's subscriptions (and both handshakes): a peer sending
# a larger part is cut off
LINK_MAX_PART_BYTES = 4096
IPC_NAME = re.compile(r"[0-9a-f]{16}")  # the name of a socket bound in an ``ipc_dir``: `ZmqTransport._bind` gives it


def sender_hwm(capacity: int) -> int:
    """A sender's send high-water mark: high enough that its window never meets it.

    libzmq's writer learns what its reader (the I/O thread) took from the pipe only every low-water mark, half the
    high-water mark, of messages; so it counts up to that many too many. At ``capacity + HWM_SLACK`` a full window
    of large messages that TCP had not yet taken looked like a full pipe: the send failed as if no peer were
    connected, and the link reopened and resent everything (a 0.2 s stall and a window of duplicates, many times a
    run). The credits bound what a sender queues; this mark only must not."""
    return 2 * capacity + HWM_SLACK


def _check_sizes(parts) -> None:
    size = sum(len(part) for part in parts)
    if size > MAX_FRAME_BYTES:
        raise FrameError(f"message of {size} bytes exceeds the limit of {MAX_FRAME_BYTES}", "oversized")


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
        self.sock: TrioSocket | None = None  # None while (re)opening: messages wait in `unacked`
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
        count_sent(self._stats, parts)
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
                opened = self._transport.open_link(link.address, self.identity, link.capacity)
                async with opened as (sock, disconnected):
                    link.sock, link.stalled = sock, trio.Event()
                    link.resend()
                    try:
                        async with trio.open_nursery() as nursery:
                            nursery.start_soon(self._read_acks, link, sock)
                            nursery.start_soon(_cancel_after, nursery.cancel_scope, disconnected.receive)
                            nursery.start_soon(_cancel_after, nursery.cancel_scope, link.stalled.wait)
                    finally:
                        link.sock = None
                        self._take_queued_acks(link, sock)
                self._stats["reconnects"] += 1
                log.info("link to %s dropped; resending %d unacknowledged messages", link.address, len(link.unacked))
                if link.stalled.is_set():
                    await trio.sleep(STALLED_RETRY_S)  # a peer that takes nothing is not retried in a tight loop

    async def _read_acks(self, link: _Link, sock: TrioSocket) -> None:
        while True:
            self._take_ack(link, await sock.receive())

    def _take_queued_acks(self, link: _Link, sock: TrioSocket) -> None:
        """A link dropped: take the acknowledgements its socket had queued and no task had read yet. A receiver
        that closes acknowledges last and then disconnects, and TCP delivers the acknowledgement before the
        disconnection; a sender busy elsewhere sees both at once, and without this would send the last
        acknowledged messages again, to the receiver's successor."""
        with contextlib.suppress(zmq.Again, zmq.ZMQError):
            while True:
                self._take_ack(link, sock.receive_nowait())

    def _take_ack(self, link: _Link, frames: list) -> None:
        try:
            kind, seq, window = decode_link(frames[0]) if len(frames) == 1 else (None, 0, 0)
            if kind is not LinkType.ACK:
                raise FrameError(f"expected an acknowledgement, got {len(frames)} parts", "bad_link")
            link.acknowledged(seq, window)
        except FrameError as error:
            self._drops.drop(error.reason, error)
            return
        except Exception as error:  # whatever a peer sends back is never this sender's crash
            self._drops.drop("receive_error", f"{type(error).__name__}: {error}")
            return
        self._credit.unpark_all()

    def statistics(self) -> dict:
        in_flight = sum(len(link.unacked) for link in self._links.values())
        return {**self._stats, "in_flight": in_flight, "dropped": self._stats["dropped"] + self._drops.total(),
                "rejected": dict(self._drops.counts)}


class ZmqTransport:
    """Channels over ZeroMQ sockets. Receivers and publishers bind `tcp://host:<random port>`, or, given ``ipc_dir``,
    a Unix socket of a random name in it, `ipc://<ipc_dir>/<name>`.

    ``ipc_dir`` (a run on one host): a directory of mode 0700 (`private_files.private_dir`; another is refused), so
    no other user can connect to the streams, nor bind a socket at an address of theirs while an actor restarts;
    and a request's ``reply_to`` must be a socket of that directory (`check_peer_address`).

    Otherwise `host` is loopback unless the config names another interface; binding beyond loopback requires `curve`
    keys, which encrypt every stream and admit only clients holding the cluster's client key.

    A sender's `capacity` is its window per receiver, a receiver's the window it grants each sender (the
    smaller wins). A publisher's and a subscriber's `capacity` are their high-water marks: pub/sub may drop.
    """

    def __init__(self, host: str = "127.0.0.1", context: zmq.Context | None = None, curve: CurveKeys | None = None,
                 rebind: list[str] = (), ipc_dir: str | os.PathLike | None = None):
        if not is_loopback(host) and curve is None and ipc_dir is None:
            raise ValueError(f"binding streams to {host!r}, beyond loopback, requires CURVE keys "
                             "(streams.curve_dir; see README, 'Security')")
        if ipc_dir is not None:
            check_private(ipc_dir)  # PermissionError: a directory other users may enter or write
        self.host = host
        self.ipc_dir = None if ipc_dir is None else str(ipc_dir)
        self.context = context or zmq.Context.instance()
        self.curve = curve
        self._authenticator = None
        # A restarted actor binds its predecessor's addresses, in the order it binds (an actor binds its
        # endpoints in the same order every time it starts): whoever sent to it reconnects by itself.
        self._rebind = list(rebind)
        self.bound: list[str] = []  # every address bound, in order: what a restart passes as ``rebind``

    def check_peer_address(self, address: str) -> None:
        """ValueError unless ``address`` may be connected to on a peer's word (a request's ``reply_to``).

        With an ``ipc_dir``: a socket this run's transports bound there, ``ipc://<ipc_dir>/<name>`` (no other file,
        directory or host). Else ``tcp://<IP address>:<port>`` (no name is resolved), on loopback when this run's
        streams bind there."""
        if self.ipc_dir is not None:
            directory, _, name = address.removeprefix("ipc://").rpartition("/")
            if not address.startswith("ipc://") or directory != self.ipc_dir or not IPC_NAME.fullmatch(name):
                raise ValueError(f"{address[:100]!r} is not a stream of this run (ipc://{self.ipc_dir}/<name>)")
            return
        scheme, _, rest = address.partition("://")
        host, _, port = rest.rpartition(":")
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            ip = None
        if scheme != "tcp" or ip is None or not (port.isascii() and port.isdigit() and 0 < int(port) < 2**16):
            raise ValueError(f"{address[:100]!r} is not tcp://<IP address>:<port>")
        if ip.is_unspecified or ip.is_multicast or (is_loopback(self.host) and not ip.is_loopback):
            raise ValueError(f"{address[:100]!r} is not where this run's streams are ({self.host})")

    @contextlib.asynccontextmanager
    async def open_receiver(self, capacity: int = 64, address: str | None = None, ack_when_done: bool | str = False,
                            max_message_bytes: int = MAX_FRAME_BYTES):
        """``ack_when_done``: False, True or "explicit" (`zmq_receiver`); ``max_message_bytes``: a message's parts
        together (ZeroMQ cuts off a peer that sends one larger part)."""
        options = {zmq.RCVHWM: capacity + HWM_SLACK, zmq.SNDHWM: capacity + HWM_SLACK, zmq.ROUTER_HANDOVER: 1,
                   zmq.MAXMSGSIZE: max_message_bytes + LINK_BYTES}
        async with self._open(zmq.ROUTER, options, RECEIVER_LINGER_MS, server=True) as sock:
            receiver = ZmqReceiver(sock, await self._bind(sock, address), capacity, ack_when_done, max_message_bytes)
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
    async def open_link(self, address: str, identity: bytes, capacity: int = 64):
        """A sender's DEALER socket to one receiver, and a socket that gets a message when it disconnects."""
        options = {zmq.ROUTING_ID: identity, zmq.SNDHWM: sender_hwm(capacity), zmq.RCVHWM: capacity + HWM_SLACK,
                   zmq.MAXMSGSIZE: LINK_MAX_PART_BYTES}
        async with self._open(zmq.DEALER, options, linger_ms=0, server=False) as sock:
            monitor = TrioSocket(sock.socket.get_monitor_socket(zmq.EVENT_DISCONNECTED))
            sock.socket.connect(address)
            try:
                yield sock, monitor
            finally:
                sock.socket.disable_monitor()
                monitor.close(0)

    @contextlib.asynccontextmanager
    async def open_publisher(self, capacity: int = 4, address: str | None = None):
        options = {zmq.SNDHWM: capacity, zmq.MAXMSGSIZE: LINK_MAX_PART_BYTES}  # what comes in: subscriptions
        async with self._open(zmq.PUB, options, linger_ms=0, server=True) as sock:
            yield ZmqPublisher(sock, await self._bind(sock, address))

    @contextlib.asynccontextmanager
    async def open_subscriber(self, addresses: list[str] = (), topics: list[bytes] = (b"",), capacity: int = 4,
                              max_message_bytes: int = MAX_FRAME_BYTES):
        options = {zmq.RCVHWM: capacity, zmq.SNDHWM: capacity + HWM_SLACK, zmq.MAXMSGSIZE: max_message_bytes}
        async with self._open(zmq.SUB, options, linger_ms=0, server=False) as sock:
            for topic in topics:
                sock.socket.setsockopt(zmq.SUBSCRIBE, topic)
            subscriber = ZmqSubscriber(sock)
            for address in addresses:
                subscriber.connect(address)
            yield subscriber

    @contextlib.asynccontextmanager
    async def _open(self, kind: int, options: dict, linger_ms: int, server: bool):
        socket = self.context.socket(kind)
        socket.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES + LINK_BYTES)  # a peer sending a larger part is cut off
        for option, value in options.items():
            socket.setsockopt(option, value)
        if self.curve is not None:
            self._secure(socket, server)
        sock = TrioSocket(socket)
        try:
            yield sock
        finally:
            sock.close(linger_ms)

    def close(self) -> None:
        """Stop the CURVE authenticator's thread, if one was started (before the context is terminated: its sockets
        would hold `zmq.Context.term` for ever)."""
        if self._authenticator is not None:
            self._authenticator.stop()
            self._authenticator = None

    def _secure(self, socket: zmq.Socket, server: bool) -> None:
        if server and self._authenticator is None:
            from zmq.auth.thread import ThreadAuthenticator

            self._authenticator = ThreadAuthenticator(self.context)
            self._authenticator.start()
            self._authenticator.configure_curve(domain="*", location=self.curve.authorized_dir)
        self.curve.secure(socket, server)

    async def _bind(self, sock: TrioSocket, address: str | None) -> str:
        if address is None and self._rebind:
            address = self._rebind.pop(0)
        if address is None and self.ipc_dir is not None:
            sock.socket.bind(f"ipc://{self.ipc_dir}/{secrets.token_hex(8)}")
        elif address is None:
            sock.socket.bind(f"tcp://{self.host}:*")
        else:
            await sock.rebind(address)
        sock.wake()
        self.bound.append(sock.socket.getsockopt_string(zmq.LAST_ENDPOINT))
        return self.bound[-1]
