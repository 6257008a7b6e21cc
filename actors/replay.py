"""ReplayActor: a buffer of scored episodes that cuts them into training batches of whole episodes.

Batches take the oldest data first: the episodes whose oldest token has the lowest policy version, in
order of arrival among equals (so a FIFO while versions arrive in order). An episode that finishes late
(a slow tool, a long game) then goes into the next batch instead of queueing behind newer ones until the
learner's staleness bound rejects it; with heavy-tailed episode times a FIFO would systematically lose the
long episodes, and the policy would learn from the short ones only.

The buffer is bounded: when it is full the actor stops reading, and the backpressure reaches the env
actors, which then start no new episodes. Nothing is dropped.

With a ``spill_dir`` nothing is lost when the actor dies either (`spill.Spill`): every episode is appended to an
Arrow file before it is acknowledged (the receiver acknowledges an episode only when the actor asks for the
next), and every batch is numbered and logged before it is sent. A restarted replay reloads the episodes no batch
took, numbers its batches on from the last one, and drops an episode it already holds (reward sends again what
it had not seen acknowledged). ``rewind(n)``: the learner has consumed batches up to number n (a restarted
learner, from its checkpoint): send again, in order, every logged batch after it.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import trio

from streams.endpoints import Inbox, Outbox
from actors.spill import Spill, episode_source
from streams.schema import Columns, decode_table, encode_table
from streams.wire import Kind


@dataclass
class ReplayConfig:
    batch_episodes: int = 64
    capacity_episodes: int = 128
    spill_dir: str | None = None  # episodes and batches on disk: a restart loses nothing


class ReplayActor:
    def __init__(self, cfg: ReplayConfig, name: str = "replay"):
        if cfg.capacity_episodes < cfg.batch_episodes:
            raise ValueError(f"replay capacity {cfg.capacity_episodes} < batch size {cfg.batch_episodes}")
        self.cfg, self.name = cfg, name
        self._stats = {"episodes_in": 0, "batches_out": 0, "episodes_out": 0, "duplicate_episodes": 0,
                       "batches_resent": 0, "reloaded_episodes": 0}
        self._buffered = 0
        self._inbox = None
        self._spill = Spill(cfg.spill_dir) if cfg.spill_dir else None
        self._received_by_source: dict[str, int] = {}  # env actor -> its episodes held or batched
        self._rewind_to: int | None = None  # resend the logged batches after this number

    async def run(self, transport, peers: dict, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self._heap: list[tuple[int, int, pa.Table]] = []  # (oldest token version, arrival, episode)
        self._arrivals = itertools.count()
        self._changed = trio.Event()
        self._seen: set[str] = set()  # episode ids held or batched: a second copy is dropped
        self._last_seq = 0
        if self._spill is not None:
            await trio.to_thread.run_sync(self._reload)
        async with (
            transport.open_receiver(capacity=16, ack_when_done=self._spill is not None) as episodes,
            transport.open_sender(peers["learner"], capacity=1) as learner,
            trio.open_nursery() as nursery,
        ):
            self._inbox = Inbox(episodes, Kind.EPISODES, decode_table)
            nursery.start_soon(self._fill)
            nursery.start_soon(self._batch, Outbox(learner, Kind.BATCH, self.name))
            task_status.started({"episodes": episodes.address, "batches_logged": self._last_seq})

    def rewind(self, consumed: int) -> None:
        """The learner has consumed the batches numbered up to ``consumed``: send the later ones again."""
        if self._spill is None:
            raise RuntimeError("replay.rewind needs replay.args.spill_dir: without it no batch is kept")
        self._rewind_to = consumed if self._rewind_to is None else min(self._rewind_to, consumed)
        self._notify()

    def _reload(self) -> None:
        episodes, batches = self._spill.load()
        for ids in batches.values():
            self._count(ids)
        self._last_seq = max(batches, default=0)
        for episode_id, episode in episodes.items():
            if episode_id not in self._seen:
                self._hold(episode_id, episode)
                self._stats["reloaded_episodes"] += 1

    def _count(self, episode_ids) -> None:
        for episode_id in episode_ids:
            self._seen.add(episode_id)
            source = episode_source(episode_id)
            self._received_by_source[source] = self._received_by_source.get(source, 0) + 1

    def _hold(self, episode_id: str, episode: pa.Table) -> None:
        self._count([episode_id])
        heapq.heappush(self._heap, (oldest_version(episode), next(self._arrivals), episode))
        self._buffered = len(self._heap)

    async def _fill(self) -> None:
        while True:
            while len(self._heap) >= self.cfg.capacity_episodes:
                await self._changed.wait()
            episode = await self._inbox.receive()
            if not episode.num_rows:  # no agent-turn of the policy's: nothing to train on, nothing to name it by
                self._stats["empty_episodes"] = self._stats.get("empty_episodes", 0) + 1
                continue
            episode_id = episode.column(Columns.EPISODE_ID)[0].as_py()
            if episode_id in self._seen:  # sent again by a restarted reward actor, or to a restarted replay
                self._stats["duplicate_episodes"] += 1
                continue
            if self._spill is not None:  # on disk before it is acknowledged (at the next receive)
                await trio.to_thread.run_sync(self._spill.add_episode, episode)
            self._hold(episode_id, episode)
            self._stats["episodes_in"] += 1
            self._notify()

    async def _batch(self, learner: Outbox) -> None:
        while True:
            while len(self._heap) < self.cfg.batch_episodes and self._rewind_to is None:
                await self._changed.wait()
            if self._rewind_to is not None:
                await self._resend(learner)
                continue
            episodes = [heapq.heappop(self._heap)[2] for _ in range(self.cfg.batch_episodes)]
            self._buffered = len(self._heap)
            self._notify()
            self._last_seq += 1
            if self._spill is not None:  # logged before it is sent: a restart knows it went (or may have)
                ids = [e.column(Columns.EPISODE_ID)[0].as_py() for e in episodes]
                await trio.to_thread.run_sync(self._spill.add_batch, self._last_seq, ids)
            await learner.send(encode_table(pa.concat_tables(episodes), batch_seq=self._last_seq))
            self._stats["batches_out"] += 1
            self._stats["episodes_out"] += len(episodes)

    async def _resend(self, learner: Outbox) -> None:
        """Send again, in order, the logged batches after the learner's cursor, from the spill files."""
        after, self._rewind_to = self._rewind_to, None
        batches = await trio.to_thread.run_sync(self._spill.batches_after, after)
        for seq, table in batches:
            await learner.send(encode_table(table, batch_seq=seq))
            self._stats["batches_resent"] += 1

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def statistics(self) -> dict:
        inbox = self._inbox.statistics() if self._inbox else {}
        return {**self._stats, "buffered": self._buffered, "batches_logged": self._last_seq,
                "received_by_source": dict(self._received_by_source),
                "dropped_frames": inbox.get("dropped_frames", 0), "streams": {"episodes": inbox}}


def oldest_version(episode: pa.Table) -> int:
    """The policy version of the episode's oldest token (0 for an episode without tokens)."""
    versions = pc.list_flatten(episode.column(Columns.POLICY_VERSIONS))
    oldest = pc.min(versions).as_py()
    return 0 if oldest is None else int(oldest)
