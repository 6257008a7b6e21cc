"""The receiving end of the credit protocol (`zmq_channels`): a ROUTER socket that acknowledges, drops
duplicates, and rejects whatever else a peer sends."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import zmq

from streams.stats import count_received, new_stats
from streams.wire import MAX_FIRST_SEQ, MAX_FRAME_BYTES, DropLog, FrameError, LinkType, decode_link, encode_link
from streams.zmq_socket import TrioSocket

MAX_PEERS = 4096  # the senders a receiver keeps state for; beyond, the first idle ones are forgotten


@dataclass
class _Peer:
    """What a receiver knows of one sender: the next sequence number it expects, what it has not acknowledged."""

    next_seq: int
    unacked: int = 0
    ack_due: bool = False


class ZmqReceiver:
    """Bound at `address`, fair-queued from all senders; acknowledges what it hands over, drops duplicates.

    Nothing a peer sends makes `receive` raise: a message that is not on the link protocol (``bad_link``), whose
    sequence number is outside its sender's acknowledgement window (``out_of_window``: at or past the next
    expected plus the window, or, for a sender's first message, past `wire.MAX_FIRST_SEQ`), whose parts together
    exceed ``max_message_bytes`` (``oversized``), from a new sender while MAX_PEERS others have messages
    unacknowledged (``too_many_peers``), or whose handling fails in any other way (``receive_error``) is rejected,
    logged and counted by reason in ``statistics()["rejected"]``. A message whose envelope is in the window takes
    its sequence number even when its body is rejected, so its sender's next is in the window too.
    """

    def __init__(self, sock: TrioSocket, address: str, capacity: int, ack_when_done: bool = False,
                 max_message_bytes: int = MAX_FRAME_BYTES):
        self._sock = sock
        self.address = address
        self._capacity = capacity
        self._ack_every = max(1, capacity // 2)
        self._ack_when_done = ack_when_done
        self.max_message_bytes = max_message_bytes  # a frame's parts together, the link envelope not counted
        self._handed: tuple[bytes, int] | None = None  # ack_when_done: (sender, seq) the actor is working on
        self._peers: dict[bytes, _Peer] = {}
        self._stats = new_stats()
        self._drops = DropLog(f"receiver {address}")

    async def receive(self) -> list[bytes]:
        if self._handed is not None:  # asking for the next: the actor is done with the last one
            self._done(self._handed[0])
            self._handed = None
        while True:
            frames = await self._sock.receive(before_wait=self.flush_acks)
            try:
                parts = self._accept(frames)
            except FrameError as error:
                self._drops.drop(error.reason, error)
                continue
            except Exception as error:  # a bug this input found: still the input's rejection, never the actor's end
                self._drops.drop("receive_error", f"{type(error).__name__}: {error}")
                continue
            if parts is not None:
                count_received(self._stats, parts)
                return parts

    def _accept(self, frames: list) -> list | None:
        """The message's parts, or None for a duplicate; FrameError for a message to reject."""
        if len(frames) < 2:
            raise FrameError("an empty message, expected a link envelope and a body", "bad_link")
        kind, seq, _ = decode_link(frames[1])
        if kind is not LinkType.DATA:
            raise FrameError(f"a link {kind.name} message where data was expected", "bad_link")
        identity = bytes(frames[0])
        peer = self._peers.get(identity)
        if peer is None:
            if seq >= MAX_FIRST_SEQ:
                raise FrameError(f"a sender's first sequence number {seq} is past {MAX_FIRST_SEQ}", "out_of_window")
            peer = self._new_peer(identity, seq)
        elif seq < peer.next_seq:  # sent again after a reconnect: delivered already
            self._stats["duplicates"] += 1
            peer.ack_due = True
            return None
        elif seq >= peer.next_seq + self._capacity:
            raise FrameError(f"sequence number {seq} is outside the window [{peer.next_seq}, "
                             f"{peer.next_seq + self._capacity})", "out_of_window")
        self._stats["gaps"] += seq - peer.next_seq
        peer.next_seq = seq + 1
        size = sum(len(part) for part in frames[2:])
        if len(frames) < 3 or size > self.max_message_bytes:  # taken (acknowledged: its sender goes on), not handed
            self._done(identity)
            if len(frames) < 3:
                raise FrameError("a link envelope without a body", "bad_link")
            raise FrameError(f"message of {size} bytes exceeds the limit of {self.max_message_bytes}", "oversized")
        if self._ack_when_done:
            self._handed = (identity, seq)
        else:
            self._done(identity)
        return frames[2:]

    def _new_peer(self, identity: bytes, seq: int) -> _Peer:
        if len(self._peers) >= MAX_PEERS:  # forget the first sender with nothing unacknowledged
            idle = next((key for key, p in self._peers.items() if not (p.unacked or p.ack_due)), None)
            if idle is None:
                raise FrameError(f"a new sender beyond {MAX_PEERS} with messages unacknowledged", "too_many_peers")
            del self._peers[idle]
        peer = self._peers[identity] = _Peer(next_seq=seq)
        return peer

    def _done(self, identity: bytes) -> None:
        peer = self._peers[identity]
        peer.unacked += 1
        if peer.unacked >= self._ack_every:
            self._ack(identity, peer)

    def _ack(self, identity: bytes, peer: _Peer, upto: int | None = None) -> None:
        """Acknowledge every message from ``identity`` before ``upto`` (default: all it handed over)."""
        upto = peer.next_seq if upto is None else upto
        with contextlib.suppress(zmq.ZMQError):  # a full pipe to a vanished peer: it resends, we ack again
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
        return {**self._stats, "in_flight": in_flight, "dropped": self._drops.total(),
                "rejected": dict(self._drops.counts)}
