"""Replies to the addresses requests name (``reply_to``): checked, and never one destination stalling another.

A request's ``reply_to`` is the requester's word, so before anything connects to it the transport checks it
(`ZmqTransport.check_peer_address`: on one host a socket of the run's private directory; else a TCP address with a
numeric host and port, on loopback when the run's streams are on loopback; no name is ever resolved). Each destination then has a sender, a bounded queue and a task of its
own, so `Replies.post` never waits: a destination that takes nothing holds up only its own replies. A reply its
destination has not taken (credit) within ``deadline_s`` of its posting is dropped, and so is a destination whose
acknowledgements stop for ``deadline_s`` while replies are in flight: its sender is closed, everything queued and
unacknowledged there is dropped. Every dropped reply is counted by reason in ``statistics()["rejected"]``:
``bad_address``, ``too_many_destinations``, ``queue_full``, ``deadline`` (and ``closed``: still queued when the
replies were closed). (To an honest requester nothing is lost
this way: it acknowledges in milliseconds; an env actor restarted meanwhile drops its predecessor's answers anyway.)

    async with open_replies(transport, Kind.COMPLETION, "rollout-0") as replies:
        replies.post(request.reply_to, completion.to_body())
"""

from __future__ import annotations

import contextlib
from collections import deque
from typing import AsyncIterator

import trio

from streams.stats import STREAM_KEYS, new_stats
from streams.wire import DropLog, FrameCounter, Kind

REPLY_WINDOW = 256  # replies unacknowledged per destination
REPLY_QUEUE = 1024  # replies waiting per destination
REPLY_QUEUE_BYTES = 256 * 2**20  # replies waiting, all destinations together
REPLY_DEADLINE_S = 30.0
MAX_DESTINATIONS = 256  # each holds two sockets; the least recently used idle one is closed for a new one
IDLE_CLOSE_S = 300.0  # a destination with nothing queued or in flight for this long is closed (at the next new one)


@contextlib.asynccontextmanager
async def open_replies(transport, kind: Kind, sender_name: str, **limits) -> AsyncIterator[Replies]:
    async with trio.open_nursery() as nursery:
        yield Replies(transport, nursery, kind, sender_name, **limits)
        nursery.cancel_scope.cancel()


class _Destination:
    def __init__(self, address: str, now: float):
        self.address = address
        self.queue: deque[tuple[float, bytes]] = deque()  # (deadline, body)
        self.posted = trio.Event()
        self.scope = trio.CancelScope()
        self.sender = None
        self.used_at = self.acked_at = now
        self.acked = 0  # replies acknowledged so far (sent less in flight)


class Replies:
    """Replies of one kind to many addresses (see the module)."""

    def __init__(self, transport, nursery: trio.Nursery, kind: Kind, sender_name: str, *, window: int = REPLY_WINDOW,
                 queue: int = REPLY_QUEUE, queue_bytes: int = REPLY_QUEUE_BYTES, deadline_s: float = REPLY_DEADLINE_S,
                 max_destinations: int = MAX_DESTINATIONS):
        self._transport, self._nursery, self._kind = transport, nursery, kind
        self._frames = FrameCounter(sender_name)
        self._window, self._queue, self._queue_bytes = window, queue, queue_bytes
        self._deadline_s, self._max_destinations = deadline_s, max_destinations
        self._destinations: dict[str, _Destination] = {}
        self._queued_bytes = 0
        self._closed = new_stats()  # the statistics of the senders closed so far
        self._drops = DropLog(f"{kind.value} replies from {sender_name}")

    def post(self, address: str, body: bytes) -> bool:
        """Queue ``body`` for ``address``; never waits. False (and counted) when it is dropped at once."""
        destination = self._destinations.get(address) or self._open(address)
        if destination is None:
            return False
        if len(destination.queue) >= self._queue or self._queued_bytes + len(body) > self._queue_bytes:
            self._drops.drop("queue_full", f"{address}: {len(destination.queue)} replies waiting")
            return False
        now = trio.current_time()
        destination.queue.append((now + self._deadline_s, body))
        destination.used_at = now
        self._queued_bytes += len(body)
        destination.posted.set()
        return True

    def _open(self, address: str) -> _Destination | None:
        try:
            self._transport.check_peer_address(address)
        except ValueError as error:
            self._drops.drop("bad_address", error)
            return None
        now = trio.current_time()
        for idle in self._idle(now - IDLE_CLOSE_S):  # swept here: no timer runs while nothing is in flight
            self._forget(idle)
        if len(self._destinations) >= self._max_destinations:
            idle = self._idle(now)
            if not idle:
                self._drops.drop("too_many_destinations", f"{address}: {len(self._destinations)} open, none idle")
                return None
            self._forget(min(idle, key=lambda d: d.used_at))
        destination = self._destinations[address] = _Destination(address, now)
        self._nursery.start_soon(self._serve, destination)
        return destination

    def _idle(self, used_before: float) -> list[_Destination]:
        """The destinations last posted to before ``used_before`` with nothing queued or in flight."""
        return [d for d in self._destinations.values() if d.used_at <= used_before and not d.queue
                and d.sender is not None and not d.sender.statistics()["in_flight"]]

    def _forget(self, destination: _Destination) -> None:
        del self._destinations[destination.address]
        destination.scope.cancel()

    async def _serve(self, destination: _Destination) -> None:
        reason = "closed"  # the actor stops, or the destination was idle and made room
        try:
            with destination.scope:
                async with self._transport.open_sender([destination.address], capacity=self._window) as sender:
                    destination.sender = sender
                    reason = await self._send_queued(destination, sender)
                    destination.scope.cancel()  # no linger: what is in flight now is dropped below
        finally:
            self._close(destination, reason)

    async def _send_queued(self, destination: _Destination, sender) -> str:
        """Send what is posted until a reply waits past its deadline, or the destination acknowledges nothing for
        ``deadline_s`` while replies are in flight (returns "deadline")."""
        while True:
            stats, now = sender.statistics(), trio.current_time()
            acked = stats["sent"] - stats["in_flight"]
            if acked > destination.acked or not stats["in_flight"]:
                destination.acked, destination.acked_at = acked, now
            if now - destination.acked_at > self._deadline_s:  # what is queued and in flight is dropped on close
                return "deadline"
            if not destination.queue:
                destination.posted = trio.Event()
                if stats["in_flight"]:  # wake by the deadline to see whether they were acknowledged
                    with trio.move_on_at(destination.acked_at + self._deadline_s * 1.001):
                        await destination.posted.wait()
                else:
                    await destination.posted.wait()
                continue
            deadline, body = destination.queue.popleft()
            self._queued_bytes -= len(body)
            with trio.move_on_at(deadline) as waited:
                await sender.send(self._frames.frame(self._kind, body))
            if waited.cancelled_caught:
                self._drops.drop("deadline", f"{destination.address} took no reply in {self._deadline_s:g} s")
                return "deadline"

    def _close(self, destination: _Destination, reason: str) -> None:
        """Forget a destination: what is queued or unacknowledged there is dropped, and counted under ``reason``."""
        if self._destinations.get(destination.address) is destination:
            del self._destinations[destination.address]
        lost = len(destination.queue)
        self._queued_bytes -= sum(len(body) for _, body in destination.queue)
        destination.queue.clear()
        if destination.sender is not None:
            stats = destination.sender.statistics()
            lost += stats["in_flight"]
            for key in STREAM_KEYS:
                self._closed[key] += 0 if key == "in_flight" else stats[key]
        for _ in range(lost):
            self._drops.drop(reason, f"{destination.address} closed ({reason}) with replies not yet acknowledged")

    def statistics(self) -> dict:
        """Every key of `stats.STREAM_KEYS` over every destination, and the replies dropped here by reason."""
        totals = dict(self._closed)
        for destination in self._destinations.values():
            if destination.sender is not None:
                stats = destination.sender.statistics()
                for key in STREAM_KEYS:
                    totals[key] += stats[key]
        totals["dropped"] += self._drops.total()
        return {**totals, "rejected": dict(self._drops.counts), "destinations": len(self._destinations),
                "queued": sum(len(d.queue) for d in self._destinations.values())}
