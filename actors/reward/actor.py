"""RewardActor: scores finished episodes, then hands them to replay.

An episode is acknowledged to its env actor only once replay has acknowledged the scored one, or once it was
dropped (rejected or unscored, and counted): the receiver's ``ack_when_done="explicit"`` (`streams.zmq_receiver`),
each episode done by its token after the drain that follows its send. A reward actor killed at any point loses
nothing: what it had not passed on is sent to its successor again, and replay drops a second copy. That holds with
a batching scorer too (a judge, ``concurrency`` > 1), which takes several episodes at once and finishes them in any
order: each env actor's episodes are acknowledged up to the oldest one still being scored.

The actor holds at most ``concurrency`` episodes; an env actor has at most its window unacknowledged (the smaller
of its sender's capacity and the receiver's, `receiver_capacity`: kept above ``concurrency``), and an episode held
holds the window for every later one of its env actor. So a scorer must finish what it holds without waiting for
more (the judge waits at most ``max_wait_s`` for a fuller batch): one that waited for more than a window would
wait forever.

Game outcomes are already rewards, so the default scorer passes them through; verifiers and judges plug in here as
scorers (`actors.reward.scorers`: a plain function from an episode table to an episode table, or an object with an async
``score``), named by ``reward.args.scorer`` in `SCORERS`. ``judge`` hosts a model of the actor's own
(`actors.reward.judges`, ``reward.args.judge``).

Every episode's rows are checked before they are scored (`streams.values.check_rows`): a row with a null or
missing id, ragged per-token lists, no action token, a negative token id or version, a non-finite value, a log-prob
above 0, or a reward or return beyond ``max_abs`` either way (``reward.args.max_abs``) is rejected, counted by
reason (``rejected_rows``) and logged at a bounded rate; the episode's other rows go on, and an episode left with
no row is not passed on at all. An episode its scorer could not score (`actors.reward.scorers.Unscored`: a judge that
failed, timed out or gave no readable score) is not passed on either: it is counted (``unscored``, by reason in
``unscored_by_reason``) and logged at a bounded rate, never trained on with a reward nobody gave it. Either drop
is told to the episode's env actor (``streams.drop_notices``), which gives the episode's admission back: an episode
dropped here holds no place in the staleness bound's allowance, so no count of drops can stall the run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

import pyarrow as pa
import trio

from actors.reward.face import RewardStatistics
from actors.reward.judges import JudgeConfig, JudgeScorer
from actors.reward.scorers import Unscored, as_scorer, game_outcome
from streams.drop_notices import DropNotices, episode_identity
from streams.endpoints import Inbox, Outbox
from streams.schema import Columns, decode_table, encode_table
from streams.values import Rejections, check_rows
from streams.wire import FRAME_LIMITS, Kind

# A scorer by name: a function of an episode, an object with an async score(), or a class made from the RewardConfig
# (its ``from_config``).
SCORERS: dict[str, object] = {"game_outcome": game_outcome, "judge": JudgeScorer}


@dataclass
class RewardConfig:
    scorer: str = "game_outcome"  # a name in SCORERS
    judge: JudgeConfig = field(default_factory=JudgeConfig)  # scorer=judge: the model and how it is asked
    tokenizer_path: Optional[str] = None  # the run's tokenizer (filled in by the topology): the judge's {prompt}
    max_abs: float = 1e3  # a row whose reward or return lies beyond this either way is refused (counted: magnitude)
    drop_every: int = 0  # fault injection (benchmarks/chaos.py): every Nth episode left unscored ("injected"); 0: none

    def __post_init__(self):
        if isinstance(self.drop_every, bool) or not isinstance(self.drop_every, int) or self.drop_every < 0:
            raise ValueError(f"reward drop_every must be an integer >= 0 (0: no episode dropped), not "
                             f"{self.drop_every!r}")
        if not 0 < self.max_abs < float("inf"):
            raise ValueError(f"reward max_abs must be a positive finite bound on rewards and returns, not "
                             f"{self.max_abs!r}")
        if isinstance(self.judge, dict):
            self.judge = JudgeConfig(**self.judge)
        if self.scorer not in SCORERS:
            raise ValueError(f"unknown scorer {self.scorer!r}; known: {', '.join(sorted(SCORERS))}")
        if self.scorer == "judge" and not self.judge.model_path:
            raise ValueError("scorer=judge needs judge.model_path: the judge's model directory "
                             "(reward.args.judge.model_path=<dir>)")


def receiver_capacity(concurrency: int) -> int:
    """The episodes' receiver's window per env actor: above the episodes the actor holds at once, with room for as
    many again done after the oldest held (a window every held episode fits in, so the actor's own limit binds)."""
    return max(16, 2 * concurrency)


def make_scorer(cfg: RewardConfig):
    entry = SCORERS[cfg.scorer]
    return as_scorer(entry.from_config(cfg) if hasattr(entry, "from_config") else entry)


class RewardActor:
    def __init__(self, cfg: RewardConfig, name: str = "reward", scorer=None):
        """``scorer``: one made already (tests); else the one ``cfg.scorer`` names."""
        self.cfg, self.name = cfg, name
        self.scorer = as_scorer(scorer) if scorer is not None else make_scorer(cfg)
        self._stats = {"episodes": 0, "rows": 0, "rejected_episodes": 0, "unscored": 0}
        self._rejected = Rejections(f"{name}: episode rows")
        self._unscored = Rejections(f"{name}: episodes left unscored")
        self._inbox = None
        self._notices: DropNotices | None = None
        self._scored = 0  # episodes handed to the scorer (``drop_every`` counts them)

    async def run(self, transport, peers: dict, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        concurrency = max(1, getattr(self.scorer, "concurrency", 1))
        async with (
            transport.open_receiver(capacity=receiver_capacity(concurrency), ack_when_done="explicit",
                                   max_message_bytes=FRAME_LIMITS[Kind.EPISODES]) as episodes,
            transport.open_sender(peers["replay"], capacity=16) as replay,
            transport.open_publisher(capacity=64) as dropped,
            trio.open_nursery() as nursery,
        ):
            self._inbox = Inbox(episodes, Kind.EPISODES, decode_table)
            self._notices = DropNotices(dropped, self.name)
            nursery.start_soon(self._notices.run)
            outbox = Outbox(replay, Kind.EPISODES, self.name)
            if hasattr(self.scorer, "run"):
                await nursery.start(self.scorer.run)
            slots, sending = trio.Semaphore(concurrency), trio.Lock()
            task_status.started({"episodes": episodes.address, "dropped": dropped.address})
            while True:
                await slots.acquire()  # at most `concurrency` episodes held: each done once passed on or dropped
                received, token = await self._inbox.receive()
                episode = self._checked(received)
                if episode is None:
                    self._inbox.done(token)  # nothing of it is kept
                    slots.release()
                    continue
                nursery.start_soon(self._score_and_send, episode, token, outbox, replay, sending, slots)

    async def _score_and_send(self, episode: pa.Table, token, outbox: Outbox, replay, sending: trio.Lock,
                              slots: trio.Semaphore) -> None:
        """Done (acknowledged to its env actor) only once passed on and acknowledged, or dropped: never when
        cancelled or failed, so that a successor gets it again."""
        try:
            try:
                self._scored += 1
                if self.cfg.drop_every and self._scored % self.cfg.drop_every == 0:
                    raise Unscored("injected", f"reward.args.drop_every={self.cfg.drop_every}")
                episode = await self.scorer.score(episode)
            except Unscored as unscored:
                self._unscored_episode(episode, unscored.reason, unscored.detail)
                self._inbox.done(token)
                return
            scored = episode.set_column(
                episode.schema.get_field_index(Columns.SCORED_AT), Columns.SCORED_AT,
                pa.array([time.time()] * episode.num_rows, pa.float64()))
            async with sending:
                await outbox.send(encode_table(scored))
                await replay.drain()  # replay has it (spilled) before the env actor is told we have
            self._inbox.done(token)
            self._stats["episodes"] += 1
            self._stats["rows"] += scored.num_rows
        finally:
            slots.release()

    def _unscored_episode(self, episode: pa.Table, reason: str, detail: str) -> None:
        self._stats["unscored"] += 1
        policy_id, name = episode_identity(episode)
        self._unscored.add({reason: 1}, f"{name or '?'}: {detail}"[:300])
        self._tell_dropped(policy_id, name, "unscored")

    def _checked(self, episode: pa.Table) -> pa.Table | None:
        """The episode's usable rows (None: none is)."""
        checked = check_rows(episode, max_abs=self.cfg.max_abs, one_episode=True)
        if checked.rejected:
            self._rejected.add(checked.rejected, checked.example)
        if checked.table.num_rows or not episode.num_rows:
            return checked.table
        self._stats["rejected_episodes"] += 1
        self._tell_dropped(*episode_identity(episode), "rejected_by_reward")
        return None

    def _tell_dropped(self, policy_id: str | None, episode_id: str | None, reason: str) -> None:
        """The episode's env actor gives its admission back (``streams.drop_notices``)."""
        if self._notices is not None:
            self._notices.dropped(policy_id, episode_id, reason)

    def statistics(self) -> RewardStatistics:
        inbox = self._inbox.statistics() if self._inbox else {}
        return {**self._stats, "rejected_rows": self._rejected.total(), "rejected_by_reason": dict(self._rejected.counts),
                "unscored_by_reason": dict(self._unscored.counts), "scorer": self.scorer.statistics(),
                "drop_notices": self._notices.counts["drop_notices"] if self._notices else 0,
                "dropped_frames": inbox.get("dropped_frames", 0), "streams": {"episodes": inbox}}
