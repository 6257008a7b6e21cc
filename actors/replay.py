"""ReplayActor: a buffer of scored episodes that cuts them into training batches of whole episodes.

Batches take the oldest data first: the episodes whose oldest token has the lowest policy version, in
order of arrival among equals (so a FIFO while versions arrive in order). An episode that finishes late
(a slow tool, a long game) then goes into the next batch instead of queueing behind newer ones until the
learner's staleness bound rejects it; with heavy-tailed episode times a FIFO would systematically lose the
long episodes, and the policy would learn from the short ones only.

The buffer is bounded: when it is full the actor stops reading, and the backpressure reaches the env
actors, which then start no new episodes. Nothing is dropped.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import trio

from actors.endpoints import Inbox, Outbox
from streams.schema import Columns, decode_table, encode_table
from streams.wire import Kind


@dataclass
class ReplayConfig:
    batch_episodes: int = 64
    capacity_episodes: int = 128


class ReplayActor:
    def __init__(self, cfg: ReplayConfig, name: str = "replay"):
        if cfg.capacity_episodes < cfg.batch_episodes:
            raise ValueError(f"replay capacity {cfg.capacity_episodes} < batch size {cfg.batch_episodes}")
        self.cfg, self.name = cfg, name
        self._stats = {"episodes_in": 0, "batches_out": 0, "episodes_out": 0}
        self._buffered = 0
        self._inbox = None

    async def run(self, transport, peers: dict, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self._heap: list[tuple[int, int, pa.Table]] = []  # (oldest token version, arrival, episode)
        self._arrivals = itertools.count()
        self._changed = trio.Event()
        async with (
            transport.open_receiver(capacity=16) as episodes,
            transport.open_sender(peers["learner"], capacity=1) as learner,
            trio.open_nursery() as nursery,
        ):
            self._inbox = Inbox(episodes, Kind.EPISODES, decode_table)
            nursery.start_soon(self._fill)
            nursery.start_soon(self._batch, Outbox(learner, Kind.BATCH, self.name))
            task_status.started({"episodes": episodes.address})

    async def _fill(self) -> None:
        while True:
            while len(self._heap) >= self.cfg.capacity_episodes:
                await self._changed.wait()
            episode = await self._inbox.receive()
            heapq.heappush(self._heap, (oldest_version(episode), next(self._arrivals), episode))
            self._buffered = len(self._heap)
            self._stats["episodes_in"] += 1
            self._notify()

    async def _batch(self, learner: Outbox) -> None:
        while True:
            while len(self._heap) < self.cfg.batch_episodes:
                await self._changed.wait()
            episodes = [heapq.heappop(self._heap)[2] for _ in range(self.cfg.batch_episodes)]
            self._buffered = len(self._heap)
            self._notify()
            await learner.send(encode_table(pa.concat_tables(episodes)))
            self._stats["batches_out"] += 1
            self._stats["episodes_out"] += len(episodes)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def statistics(self) -> dict:
        inbox = self._inbox.statistics() if self._inbox else {}
        return {**self._stats, "buffered": self._buffered, "dropped_frames": inbox.get("dropped_frames", 0),
                "streams": {"episodes": inbox}}


def oldest_version(episode: pa.Table) -> int:
    """The policy version of the episode's oldest token (0 for an episode without tokens)."""
    versions = pc.list_flatten(episode.column(Columns.POLICY_VERSIONS))
    oldest = pc.min(versions).as_py()
    return 0 if oldest is None else int(oldest)
