"""The receiving end of the credit protocol (`zmq_channels`): a ROUTER socket that acknowledges, drops
duplicates, and rejects whatever else a peer sends.

When a message is done, and so may be acknowledged, is the receiver's ``ack_when_done``:

- ``False``: as soon as it is handed to the actor.
- ``True``: once the actor asks for the next message (an actor that finishes one message before it takes another).
- ``"explicit"``: once the actor calls ``done(token)`` with the token `receive` returned beside the message
  (``(parts, token)``), in any order: an actor that holds several messages at once (a batching reward actor) and
  passes each on when it can. A sender's messages are acknowledged cumulatively, so they are acknowledged up to
  the oldest one not yet done; those done after it wait with it. A sender has at most its window (`zmq_channels`)
  unacknowledged, so an actor that holds more than a window of one sender's messages waits for nothing but its
  own work: it must finish what it holds without waiting for more.

In every mode a receiver closed (its actor killed) leaves what was handed and not done unacknowledged: its sender
sends it again to a successor at the same address.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import zmq

from streams.stats import count_received, new_stats
from streams.wire import MAX_FIRST_SEQ, MAX_FRAME_BYTES, DropLog, FrameError, LinkType, decode_link, encode_link
from streams.zmq_socket import TrioSocket

MAX_PEERS = 4096  # the senders a receiver keeps state for; beyond, the first idle ones are forgotten


@dataclass
class _Peer:
    """What a receiver knows of one sender: the next sequence number it expects, what it acknowledged last, what the
    actor holds (handed over, not done)."""

    next_seq: int
    acked: int  # every message before this one is acknowledged (the last acknowledgement's ``upto``)
    held: set[int] = field(default_factory=set)
    ack_due: bool = False  # a duplicate came in: its sender is told again what was acknowledged

    def done_upto(self) -> int:
        """Every message before this one is done: the oldest held, or every one taken."""
        return min(self.held) if self.held else self.next_seq


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

    def __init__(self, sock: TrioSocket, address: str, capacity: int, ack_when_done: bool | str = False,
                 max_message_bytes: int = MAX_FRAME_BYTES):
        if ack_when_done not in (False, True, "explicit"):
            raise ValueError(f"ack_when_done is False, True or 'explicit', not {ack_when_done!r}")
        self._sock = sock
        self.address = address
        self._capacity = capacity
        self._ack_every = max(1, capacity // 2)
        self._holds = bool(ack_when_done)  # a message handed over is held until it is done
        self.explicit = ack_when_done == "explicit"  # receive gives (parts, token); the actor calls done(token)
        self.max_message_bytes = max_message_bytes  # a frame's parts together, the link envelope not counted
        self._handed: tuple[bytes, int] | None = None  # ack_when_done=True: (sender, seq) the actor is working on
        self._peers: dict[bytes, _Peer] = {}
        self._stats = new_stats()
        self._drops = DropLog(f"receiver {address}")

    async def receive(self) -> list[bytes] | tuple[list[bytes], tuple[bytes, int]]:
        """The next message's parts; opened with ``ack_when_done="explicit"``, ``(parts, token)`` for `done`."""
        if self._handed is not None:  # asking for the next: the actor is done with the last one
            handed, self._handed = self._handed, None
            self._finish(handed, self._ack_every)
        while True:
            frames = await self._sock.receive(before_wait=self.flush_acks)
            try:
                accepted = self._accept(frames)
            except FrameError as error:
                self._drops.drop(error.reason, error)
                continue
            except Exception as error:  # a bug this input found: still the input's rejection, never the actor's end
                self._drops.drop("receive_error", f"{type(error).__name__}: {error}")
                continue
            if accepted is not None:
                parts, token = accepted
                count_received(self._stats, parts)
                return (parts, token) if self.explicit else parts

    def done(self, token: tuple[bytes, int]) -> None:
        """``ack_when_done="explicit"``: the actor is through with the message ``token`` came with (kept it, or
        passed it on and saw it acknowledged, or dropped it). Its sender is acknowledged at once up to its oldest
        message not yet done, when that moved. ValueError for a token not handed over, or done already."""
        if not self.explicit:
            raise ValueError("done() is for a receiver opened with ack_when_done='explicit'")
        identity, seq = token
        peer = self._peers.get(identity)
        if peer is None or seq not in peer.held:
            raise ValueError(f"message {seq} of sender {identity!r} is not held: never handed over, or done already")
        self._finish(token, 1)

    def _finish(self, token: tuple[bytes, int], ack_after: int) -> None:
        """The message of ``token`` is done: acknowledge when ``ack_after`` or more are done and unacknowledged."""
        identity, seq = token
        peer = self._peers[identity]
        peer.held.discard(seq)
        self._ack_if(identity, peer, ack_after)

    def _ack_if(self, identity: bytes, peer: _Peer, ack_after: int) -> None:
        if peer.done_upto() - peer.acked >= ack_after:
            self._ack(identity, peer)

    def _accept(self, frames: list) -> tuple[list, tuple[bytes, int]] | None:
        """The message's parts and token, or None for a duplicate; FrameError for a message to reject."""
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
            self._ack_if(identity, peer, self._ack_every)
            if len(frames) < 3:
                raise FrameError("a link envelope without a body", "bad_link")
            raise FrameError(f"message of {size} bytes exceeds the limit of {self.max_message_bytes}", "oversized")
        token = (identity, seq)
        if not self._holds:
            self._ack_if(identity, peer, self._ack_every)
        else:
            peer.held.add(seq)
            if not self.explicit:
                self._handed = token
        return frames[2:], token

    def _new_peer(self, identity: bytes, seq: int) -> _Peer:
        if len(self._peers) >= MAX_PEERS:  # forget the first sender with nothing unacknowledged
            idle = next((key for key, p in self._peers.items() if p.next_seq == p.acked and not p.ack_due), None)
            if idle is None:
                raise FrameError(f"a new sender beyond {MAX_PEERS} with messages unacknowledged", "too_many_peers")
            del self._peers[idle]
        peer = self._peers[identity] = _Peer(next_seq=seq, acked=seq)
        return peer

    def _ack(self, identity: bytes, peer: _Peer) -> None:
        """Acknowledge every message from ``identity`` before its oldest not yet done."""
        upto = peer.done_upto()
        with contextlib.suppress(zmq.ZMQError):  # a full pipe to a vanished peer: it resends, we ack again
            self._sock.send_nowait([identity, encode_link(LinkType.ACK, upto, self._capacity)])
        peer.acked, peer.ack_due = upto, False

    def flush_acks(self) -> None:
        """Acknowledge what the actor is done with (on close, what it holds is not)."""
        for identity, peer in self._peers.items():
            if peer.done_upto() > peer.acked or peer.ack_due:
                self._ack(identity, peer)

    def statistics(self) -> dict:
        """``in_flight``: taken and not acknowledged; ``held``: handed over and not done (``ack_when_done``)."""
        peers = self._peers.values()
        return {**self._stats, "in_flight": sum(p.next_seq - p.acked for p in peers),
                "held": sum(len(p.held) for p in peers), "dropped": self._drops.total(),
                "rejected": dict(self._drops.counts)}
