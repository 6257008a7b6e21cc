"""ReplayActor: a buffer of scored episodes that cuts them into training batches of whole episodes.

Batches take the oldest data first (`buffer.OldestFirst`): the episodes whose oldest token has the lowest policy
version, in order of arrival among equals (so a FIFO while versions arrive in order). An episode that finishes late
(a slow tool, a long game) then goes into the next batch instead of queueing behind newer ones until the
learner's staleness bound rejects it; with heavy-tailed episode times a FIFO would systematically lose the
long episodes, and the policy would learn from the short ones only.

A batch holds ``batch_episodes`` episodes, or fewer where the next would make its frame larger than the batch
frame limit (``streams.wire.FRAME_LIMITS``, or ``max_batch_bytes`` when lower): long-context episodes go out in
smaller batches (``short_batches``). An episode larger than the limit on its own could never be sent: it is
refused as it arrives, before it is spilled, and counted (``refused_by_reason``).

The buffer is bounded: when it is full the actor stops reading, and the backpressure reaches the env
actors, which then start no new episodes. Nothing is dropped.

With a ``spill_dir`` nothing is lost when the actor dies either (`spill.Spill`): every episode is appended to an
Arrow file before it is acknowledged (the receiver acknowledges an episode only when the actor asks for the
next), and every batch is numbered and logged before it is sent. A restarted replay reloads the episodes no batch
took, numbers its batches on from the last one, and drops an episode it already holds (reward sends again what
it had not seen acknowledged). ``rewind(n)``: the learner has consumed batches up to number n (a restarted
learner, from its checkpoint): send again, in order, every logged batch after it.

With a ``checkpoint_dir`` (the learner's), the spill is compacted below the checkpoint's data cursor each time a
new checkpoint appears (and before a restart reloads), so a restart reloads what is live. With ``resume`` (a
resumed run), a replay whose spill is still empty first takes over the previous life's live episodes and the
batches after that life's checkpointed cursor, numbered 1, 2, ... in this life (the learner's cursor starts at 0
in a new life), and holds them, and the episodes, back until ``rewind`` (the run starts training: its resume
evaluation is played by the checkpointed policy).

Every episode is checked before it is kept (``_admit``, `streams.values.check_rows`), as it arrives and as it
is reloaded from a spill: a row with a null or missing id, ragged per-token lists, no action token, more prompt and
action tokens than ``max_row_tokens`` (the model's context), a token id outside ``vocab_size``, a non-finite value,
a log-prob above 0, or a policy version below 0 or above what the learner can have reached is rejected, counted
by reason (``rejected_by_reason``) and logged at a bounded rate; it never reaches the spill or a batch. The
episode's other rows go on. What the learner can have reached: its highest announced version, plus a version for
each batch sent since (the learner's version rises by one an update), plus ``VERSION_SLACK`` (batches in flight
when it announced, a league reset), plus what the learner's own bound allows past it (``Trainer.newest_version``):
once the learner has restarted (an announced life above 0) or the run was resumed, its dead predecessor may have
published up to ``checkpoint_every`` versions past the checkpoint the living one started from, and episodes
sampled with those are honest (without periodic checkpoints no ceiling is known). So a replay that starts after
the learner came back at an older checkpoint refuses none of them. With a ``versions`` peer, replay takes no
episode before the first announcement (the learner announces every second). The learner itself refuses any token
newer than its bound.

An episode rejected whole or refused is told to its env actor (``streams.drop_notices``), which gives its admission
back: it will never be consumed, and its place in the staleness bound's allowance must not stay taken.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import pyarrow as pa
import trio

from actors.models.checkpoint_dir import find_checkpoint
from actors.replay.buffer import OldestFirst
from actors.replay.face import ReplayStatistics
from actors.replay.spill import Spill, episode_source, previous_life
from streams.drop_notices import DropNotices, episode_identity
from streams.endpoints import Inbox, Outbox
from streams.messages import VERSION_TOPIC, VersionAnnounced
from streams.schema import Columns, decode_table, encode_table
from streams.values import Rejections, check_rows
from streams.wire import FRAME_LIMITS, MAX_HEADER_BYTES, Kind

log = logging.getLogger(__name__)
LINK_SLACK_BYTES = 64  # beside the header: room for a link envelope, should a limit count every part of a message
VERSION_SLACK = 4  # versions beyond the learner's announced one plus the batches sent since (see the docstring)


@dataclass
class ReplayConfig:
    batch_episodes: int = 64
    capacity_episodes: int = 128
    max_batch_bytes: int | None = None  # a batch body at most this large (null: the batch frame limit)
    spill_dir: str | None = None  # episodes and batches on disk: a restart loses nothing
    checkpoint_dir: str | None = None  # the learner's checkpoints: the spill is compacted below their data cursor
    resume: bool = False  # a resumed run: take over the previous life's live episodes and batches
    vocab_size: int | None = None  # the learner's vocabulary: a token id at or above it is refused (None: unchecked)
    checkpoint_every: int = 0  # the learner's: how far past its checkpoint a dead learner may have published
    max_row_tokens: int | None = None  # the model's context: a row of more prompt and action tokens is refused
    # (None: unchecked); the learner refuses such a row too, against its model's max_position_embeddings


class ReplayActor:
    def __init__(self, cfg: ReplayConfig, name: str = "replay"):
        if cfg.capacity_episodes < cfg.batch_episodes:
            raise ValueError(f"replay capacity {cfg.capacity_episodes} < batch size {cfg.batch_episodes}")
        if cfg.max_batch_bytes is not None and cfg.max_batch_bytes <= 0:
            raise ValueError(f"replay max_batch_bytes {cfg.max_batch_bytes}: give a positive size, or null")
        if cfg.max_row_tokens is not None and cfg.max_row_tokens < 2:
            raise ValueError(f"replay max_row_tokens {cfg.max_row_tokens}: a row holds a prompt token and an action "
                             "token at least; give the model's context, or null")
        self.cfg, self.name = cfg, name
        self._stats = {"episodes_in": 0, "batches_out": 0, "episodes_out": 0, "duplicate_episodes": 0,
                       "batches_resent": 0, "reloaded_episodes": 0, "short_batches": 0, "compactions": 0,
                       "compacted_episodes": 0, "inherited_batches": 0, "inherited_episodes": 0}
        self._refused: dict[str, int] = {}  # episodes refused, by reason
        self.buffer = OldestFirst(cfg.batch_episodes, self.batch_bytes_limit)  # the episodes held, oldest first
        self._inbox = None
        self._spill = Spill(cfg.spill_dir) if cfg.spill_dir else None
        if self._spill is not None:
            self._spill.remove_partial()  # what a write cut short left: never read, holding space
        self._received_by_source: dict[str, int] = {}  # env actor -> its episodes held or batched
        self._rewind_to: int | None = None  # resend the logged batches after this number
        self._held_back = False  # what a resumed run took over waits for the first ``rewind``
        self._checkpoint_seen = None  # the learner's checkpoint directory (inode, time) at the last compaction
        self._rejected = Rejections(f"{name}: episode rows")
        self._learner_version: int | None = None  # the highest version its learner announced ...
        self._sent_at_announcement = 0  # ... and the batches sent when it heard it
        self._learner_life = 0  # the newest life of its learner announced
        self._version_known = trio.Event()  # the learner's first announcement (at once without a versions peer)
        self._notices: DropNotices | None = None

    def batch_bytes_limit(self) -> int:
        """The largest batch body that goes out: within the batch frame limit with its header (looked up now, so
        a limit changed at run time holds), and within ``max_batch_bytes``."""
        limit = FRAME_LIMITS[Kind.BATCH] - MAX_HEADER_BYTES - LINK_SLACK_BYTES
        return min(limit, self.cfg.max_batch_bytes) if self.cfg.max_batch_bytes else limit

    async def run(self, transport, peers: dict, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self._changed = trio.Event()
        self._seen: set[str] = set()  # episode ids held or batched, not compacted: a second copy is dropped
        self._last_seq = 0
        self._disk = trio.Lock()  # one spill operation at a time (each on a thread)
        if not peers.get("versions"):
            self._version_known.set()
        if self._spill is not None:
            await trio.to_thread.run_sync(self._reload)
        async with (
            transport.open_receiver(capacity=16, ack_when_done=self._spill is not None,
                                   max_message_bytes=FRAME_LIMITS[Kind.EPISODES]) as episodes,
            transport.open_sender(peers["learner"], capacity=1) as learner,
            transport.open_subscriber(peers.get("versions", []), topics=[VERSION_TOPIC]) as versions,
            transport.open_publisher(capacity=64) as dropped,
            trio.open_nursery() as nursery,
        ):
            self._inbox = Inbox(episodes, Kind.EPISODES, decode_table)
            self._notices = DropNotices(dropped, self.name)
            nursery.start_soon(self._notices.run)
            nursery.start_soon(self._follow_versions, Inbox(versions, Kind.VERSION, VersionAnnounced.from_body,
                                                            topic=True))
            nursery.start_soon(self._fill)
            nursery.start_soon(self._batch, Outbox(learner, Kind.BATCH, self.name))
            task_status.started({"episodes": episodes.address, "dropped": dropped.address,
                                 "batches_logged": self._last_seq,
                                 "inherited_episodes": self._stats["inherited_episodes"]})

    def rewind(self, consumed: int) -> None:
        """The learner has consumed the batches numbered up to ``consumed``: send the later ones again."""
        if self._spill is None:
            raise RuntimeError("replay.rewind needs replay.args.spill_dir: without it no batch is kept")
        self._rewind_to = consumed if self._rewind_to is None else min(self._rewind_to, consumed)
        self._held_back = False
        self._notify()

    def _reload(self) -> None:
        inherited = self.cfg.resume and self._spill.is_empty() and self._inherit()
        self._compact()
        episodes, batches = self._spill.load()
        for ids in batches.values():
            self._count(ids)
        for source, delivered in self._spill.state.by_source.items():  # in the compacted batches
            self._received_by_source[source] = self._received_by_source.get(source, 0) + delivered
        self._last_seq = max(batches, default=self._spill.state.through)
        for episode in episodes.values():
            episode = self._admit(episode)  # a spill written before the checks may hold what they refuse
            episode_id = episode.column(Columns.EPISODE_ID)[0].as_py() if episode is not None else None
            if episode is not None and episode_id not in self._seen and self._admissible(episode_id, episode):
                self._hold(episode_id, episode)
                self._stats["reloaded_episodes"] += 1
        taken = self._spill.state.inherited or {}
        self._stats["inherited_batches"] = taken.get("batches", 0)
        self._stats["inherited_episodes"] = taken.get("episodes", 0)
        self._held_back = bool(inherited)  # until the run trains: then the batches taken over go first

    def _inherit(self) -> bool:
        """Take over the previous life's live episodes, and its batches after the checkpoint's cursor numbered
        1, 2, ... (a batch too large for this life's limit, or naming an episode not on disk, gives its episodes
        back to be held). Whether there was anything to take."""
        previous = previous_life(self.cfg.spill_dir)
        if previous is None or not self.cfg.checkpoint_dir:
            return False
        after = checkpointed_cursor(self.cfg.checkpoint_dir, previous.name)
        episodes, batches = Spill(str(previous)).live_after(after)
        taken = batched = 0
        for ids in batches:
            whole = all(i in episodes for i in ids)
            if whole and self.buffer.fits([episodes[i] for i in ids]):
                for episode_id in ids:
                    self._spill.add_episode(episodes.pop(episode_id))
                taken, batched = taken + 1, batched + len(ids)
                self._spill.add_batch(taken, ids)
        for episode in episodes.values():  # held, and those of a batch given back
            self._spill.add_episode(episode)
        self._spill.close()
        self._spill.mark_inherited({"life": previous.name, "after": after, "batches": taken,
                                    "episodes": batched + len(episodes)})
        log.info("%s: took over %d batches and %d held episodes from life %s (after its batch %d)", self.name,
                 taken, len(episodes), previous.name, after)
        return bool(taken or episodes)

    def _compact(self) -> list[str]:
        """Compact the spill below the learner's checkpointed data cursor in this life (on a thread)."""
        if not self.cfg.checkpoint_dir:
            return []
        try:
            cursor = checkpointed_cursor(self.cfg.checkpoint_dir, self._spill.life)
        except (OSError, RuntimeError, EOFError) as error:  # being swapped in right now: at the next batch
            log.info("%s: the learner's checkpoint not read (%s); compaction waits", self.name, error)
            self._checkpoint_seen = None
            return []
        moved = self._spill.compact(cursor)
        if moved:
            self._stats["compactions"] += 1
            self._stats["compacted_episodes"] += len(moved)
        return moved

    async def _compact_if_checkpointed(self) -> None:
        """After a batch: when the learner wrote a checkpoint since the last look, compact below its cursor."""
        if self._spill is None or not self.cfg.checkpoint_dir:
            return
        try:
            stat = os.stat(self.cfg.checkpoint_dir)
            seen = (stat.st_ino, stat.st_mtime_ns)
        except FileNotFoundError:
            return
        if seen == self._checkpoint_seen:
            return
        self._checkpoint_seen = seen
        async with self._disk:
            moved = await trio.to_thread.run_sync(self._compact)
        self._seen.difference_update(moved)  # the spill's consumed ids answer for them now

    def _count(self, episode_ids) -> None:
        for episode_id in episode_ids:
            self._seen.add(episode_id)
            if self._spill is None or self._spill.own(episode_id):  # a previous life's: its env actor is gone
                source = episode_source(episode_id)
                self._received_by_source[source] = self._received_by_source.get(source, 0) + 1

    def _known(self, episode_id: str) -> bool:
        return episode_id in self._seen or (self._spill is not None and episode_id in self._spill.state.consumed)

    def _admissible(self, episode_id: str, episode: pa.Table) -> bool:
        """Whether an episode can go out in a batch at all (alone, it fits the limit); if not, refused and said."""
        if self.buffer.fits([episode]):
            return True
        self._refused["larger_than_batch_limit"] = self._refused.get("larger_than_batch_limit", 0) + 1
        log.warning("%s refused episode %s: alone it makes a batch of %d bytes, over the limit of %d", self.name,
                    episode_id, self.buffer.batch_bytes([episode]), self.batch_bytes_limit())
        return False

    def _hold(self, episode_id: str, episode: pa.Table) -> None:
        self._count([episode_id])
        self.buffer.hold(episode)

    async def _fill(self) -> None:
        while True:
            while len(self.buffer) >= self.cfg.capacity_episodes:
                await self._changed.wait()
            await self._version_known.wait()  # the ceiling on versions is known before an episode is kept
            received = await self._inbox.receive()
            episode = self._admit(received)
            if episode is None:
                self._tell_dropped(received, "rejected_by_replay")
                continue
            episode_id = episode.column(Columns.EPISODE_ID)[0].as_py()
            if self._known(episode_id):  # sent again by a restarted reward actor, or to a restarted replay
                self._stats["duplicate_episodes"] += 1
                continue
            if not self._admissible(episode_id, episode):  # before the spill: it never comes back
                self._tell_dropped(episode, "refused_by_replay")
                continue
            if self._spill is not None:  # on disk before it is acknowledged (at the next receive)
                async with self._disk:
                    await trio.to_thread.run_sync(self._spill.add_episode, episode)
            self._hold(episode_id, episode)
            self._stats["episodes_in"] += 1
            self._notify()

    def _tell_dropped(self, episode: pa.Table, reason: str) -> None:
        """The episode's env actor gives its admission back (``streams.drop_notices``)."""
        if self._notices is not None and episode.num_rows:
            self._notices.dropped(*episode_identity(episode), reason)

    async def _batch(self, learner: Outbox) -> None:
        while True:
            while (self._held_back or not self.buffer.ready()) and self._rewind_to is None:
                await self._changed.wait()
            if self._rewind_to is not None:
                await self._resend(learner)
                continue
            episodes = self.buffer.cut()
            if len(episodes) < self.cfg.batch_episodes:
                self._stats["short_batches"] += 1
            self._notify()
            self._last_seq += 1
            body = encode_table(pa.concat_tables(episodes), batch_seq=self._last_seq)
            if self._spill is not None:  # logged before it is sent: a restart knows it went (or may have)
                ids = [e.column(Columns.EPISODE_ID)[0].as_py() for e in episodes]
                async with self._disk:
                    await trio.to_thread.run_sync(self._spill.add_batch, self._last_seq, ids)
            await learner.send(body)
            self._stats["batches_out"] += 1
            self._stats["episodes_out"] += len(episodes)
            await self._compact_if_checkpointed()

    async def _resend(self, learner: Outbox) -> None:
        """Send again, in order, the logged batches after the learner's cursor, from the spill files."""
        after, self._rewind_to = self._rewind_to, None
        async with self._disk:
            batches = await trio.to_thread.run_sync(self._spill.batches_after, after)
        for seq, table in batches:
            await learner.send(encode_table(table, batch_seq=seq))
            self._stats["batches_resent"] += 1

    def _admit(self, episode: pa.Table) -> pa.Table | None:
        """The episode's rows that pass the checks (None: nothing to keep; counted)."""
        if not episode.num_rows:  # no agent-turn of the policy's: nothing to train on, nothing to name it by
            self._stats["empty_episodes"] = self._stats.get("empty_episodes", 0) + 1
            return None
        checked = check_rows(episode, vocab_size=self.cfg.vocab_size, max_tokens=self.cfg.max_row_tokens,
                             one_episode=True, max_version=self.version_ceiling())
        if checked.rejected:
            self._rejected.add(checked.rejected, checked.example)
        if not checked.table.num_rows:
            self._stats["rejected_episodes"] = self._stats.get("rejected_episodes", 0) + 1
            return None
        return checked.table

    def version_ceiling(self) -> int | None:
        """The newest version an episode's token may carry now (None: no bound is known; see the module)."""
        if self._learner_version is None:
            return None
        past = 0
        if self._learner_life > 0 or self.cfg.resume:  # its predecessor may have published past the checkpoint
            if not self.cfg.checkpoint_every:
                return None
            past = self.cfg.checkpoint_every
        sent = self._stats["batches_out"] + self._stats["batches_resent"] - self._sent_at_announcement
        return self._learner_version + sent + past + VERSION_SLACK

    async def _follow_versions(self, inbox: Inbox) -> None:
        while True:
            self.version_announced(await inbox.receive())

    def version_announced(self, announced: VersionAnnounced) -> None:
        """The learner's announcement: the highest version of any life is kept (a lower one of a newer life
        narrows nothing: episodes sampled by the dead life's weights are still in flight), and its newest life."""
        self._learner_life = max(self._learner_life, announced.life)
        if self._learner_version is None or announced.version > self._learner_version:
            self._learner_version = announced.version
            self._sent_at_announcement = self._stats["batches_out"] + self._stats["batches_resent"]
        self._version_known.set()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def statistics(self) -> ReplayStatistics:
        inbox = self._inbox.statistics() if self._inbox else {}
        spill = self._spill.state.through if self._spill is not None else 0
        return {**self._stats, "buffered": len(self.buffer), "batches_logged": self._last_seq,
                "received_by_source": dict(self._received_by_source), "compacted_through": spill,
                "rejected_rows": self._rejected.total(), "rejected_by_reason": dict(self._rejected.counts),
                "learner_version": self._learner_version, "learner_life": self._learner_life,
                "drop_notices": self._notices.counts["drop_notices"] if self._notices else 0,
                "refused_episodes": sum(self._refused.values()), "refused_by_reason": dict(self._refused),
                "batch_bytes_limit": self.batch_bytes_limit(), "held_back": self._held_back,
                "dropped_frames": inbox.get("dropped_frames", 0), "streams": {"episodes": inbox}}


def checkpointed_cursor(checkpoint_dir: str, life: str) -> int:
    """The learner's checkpointed data cursor in ``life`` (0: none); torch is loaded only once there is one."""
    if find_checkpoint(checkpoint_dir) is None:
        return 0
    from actors.models.checkpoints import checkpoint_cursor

    return checkpoint_cursor(checkpoint_dir, life)
