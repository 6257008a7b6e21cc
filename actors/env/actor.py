"""EnvActor: runs many live episodes, stepped together in a lane group, and asks rollout actors for the policy's moves.

It composes five parts, each in its own module:

- ``actors.env.lanes``: every live episode stepped by one task (``LaneGroup``), each in a lane: a tick plays every
  move answered and asks every seat that waits, together; a finished episode's rows are columns already;
- ``actors.env.policy_client``: the policy's moves asked of the rollout actors (``PolicyClient``);
- ``actors.env.admission``: when a training episode may start, so that none falls too far behind the learner;
- ``actors.env.matches``: where a training match comes from (self-play, or the league), chosen in ``run``.

Training episodes play the match source's matches and go to the reward actor of the match's learner when
they end; one that errored (a lost completion included: ``actors.env.policy_client``), or ended before the
learner's turn, is never consumed and gives its admission back; so does one that the reward actor or replay
dropped after its delivery, which they say in a drop notice on this actor's topic (``streams.drop_notices``).
Evaluation episodes seat the policy against a fixed opponent in each seat in turn; their results are kept in
``statistics()["evaluations"]`` and never trained on.

Episode ids carry the run's ``life`` (a resumed run is a new one), so they never repeat in a run directory.
A restarted env actor (``incarnation`` > 0) names its episodes and requests apart from its predecessor's, and
counts as started what its predecessors delivered (``started_before``, see ``actors.env.admission``). With a
``ledger_dir`` each training episode's id is appended to ``<ledger_dir>/<name>.txt`` once the reward actor has
acknowledged it: the chaos benchmark's record of what was produced.

In a league, ``peers`` holds ``league``, and ``rollout``/``reward`` map each member to its group: each seat's
generation requests go to the rollout group of the seat's member, and the learner's rows to that member's
reward actor.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import logging
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import trio

from actors.env.admission import Admission
from actors.env.deliveries import Deliveries
from actors.env.episode import EpisodeCounts, move_token_budget
from actors.env.lanes import EpisodeSettings, LaneGroup, Played
from actors.env.evaluation import EvaluationTally
from actors.env.face import EnvStatistics
from actors.env.policy_client import (REQUEST_DEADLINE_S, Answers, PolicyClient, TokenCodec, by_member,
                                      open_policy_client)
from actors.models.chat import PromptRenderer, prompt_format
from actors.league.matchmaking import WEIGHTINGS, Payoff
from actors.env.matches import Match, MatchSource, SelfPlayMatches, open_league_matches, seated, uniform_seats
from envs.answers import answer_problem
from envs.registry import OPPONENTS, make
from streams.disk import append_line
from streams.endpoints import Inbox, open_outboxes
from streams.messages import VERSION_TOPIC, EpisodeDropped, VersionAnnounced, dropped_topic
from streams.schema import Columns
from streams.wire import Kind

POLICY = "policy"
TASKS_SAVE_S = 30.0  # how often a role game's task buffer is saved with the run
DROP_REASONS = ("unscored", "rejected_by_reward", "rejected_by_replay", "refused_by_replay")  # drop notices'
GIVEN_BACK_MEMORY = 65536  # ids of dropped episodes remembered, so that a repeated notice counts once
log = logging.getLogger(__name__)


@dataclass
class EnvConfig:
    tokenizer_path: str
    env_name: str = "tictactoe"
    policy_id: str = "main"
    concurrency: int = 64  # live training episodes
    temperature: float = 1.0
    max_new_tokens: int = 8
    max_prompt_tokens: int | None = None  # keep only the last this many prompt tokens (the model's context)
    env_args: dict = field(default_factory=dict)  # the environment's own arguments, e.g. {"players": 4}
    invalid_penalty: float = -1.0  # a forfeit: the mover's reward when it runs out of retries
    max_retries: int = 0  # invalid actions a turn may retry (each costs retry_penalty) before the forfeit
    retry_penalty: float = -0.1
    answer: str = "first_bracket"  # where the policy's move is in its completion (``envs.answers``: boxed, ...)
    format_penalty: float = 0.0  # added to the mover's reward for a completion with no answer in that form
    truncation_penalty: float = 0.0  # added to the mover's reward for a completion cut at max_new_tokens
    max_staleness: int = 2  # eta: how many versions behind the learner a started episode may fall
    batch_episodes: int = 64  # the learner's batch size B, for admission
    admission_slot: tuple[int, int] = (0, 1)  # (i, n): this actor is i of n sharing the admission allowance
    start_version: int = 0  # the learner's version when this actor starts (a resumed run's checkpoint)
    start_versions: dict = field(default_factory=dict)  # a league: each member's start version
    opponent: str = "random"  # the fixed opponent of the training games below
    opponent_share: float = 0.0  # fraction of training games against ``opponent`` instead of the mirror
    # The policy's seat in those games: "uniform", or a PFSP weighting (actors.league.matchmaking: hard, variance,
    # linear_capped) over its decayed score in each seat against ``opponent``: more games where it is weaker.
    opponent_seat: str = "uniform"
    opponent_seat_decay: float = 0.995  # the per-game decay of those scores (about the last 200 games)
    seed: int = 0
    incarnation: int = 0  # how many times this actor was restarted in its run
    # member -> training episodes its predecessors delivered in this run (a restart's admission)
    started_before: dict = field(default_factory=dict)
    # Its admission count beyond its own episodes: by default its share of start_version * batch_episodes (what
    # the learner consumed before this life); after a rebalance (a scale of env actors), what the launcher says.
    admission_offset: int | None = None
    ledger_dir: str | None = None  # append each delivered training episode's id here (accounting)
    life: str = ""  # this start of the run (a resumed run is a new life): episode ids carry it
    tasks_dir: str | None = None  # a role game's task buffer is kept here with the run (``<name>.arrows``)
    prompt: dict = field(default_factory=dict)  # the run's prompt section: template, history, system (chat.py)
    max_context_tokens: int | None = None  # a turn's prompt and token budget must fit, else its episode ends
    request_deadline_s: float = REQUEST_DEADLINE_S  # a move unanswered this long is asked again, then its episode drops

    def __post_init__(self):
        if self.policy_id in OPPONENTS:
            raise ValueError(f"policy_id {self.policy_id!r} is the name of a fixed opponent; choose another")
        if self.opponent_seat != "uniform" and self.opponent_seat not in WEIGHTINGS:
            raise ValueError(f"opponent_seat {self.opponent_seat!r}: choose uniform or a PFSP weighting "
                             f"({', '.join(WEIGHTINGS)})")
        Payoff(self.opponent_seat_decay)  # checks the decay
        problem = answer_problem(self.answer, self.env_name)
        if problem:
            raise ValueError(problem)
        if not self.request_deadline_s > 0:  # said at launch, not when the first episode asks for a move
            raise ValueError(f"request_deadline_s must be a positive number of seconds, not {self.request_deadline_s}")
        for key in ("format_penalty", "truncation_penalty"):
            if not math.isfinite(getattr(self, key)):
                raise ValueError(f"{key} must be a finite number, not {getattr(self, key)}")
        self.prompt_format = prompt_format(**self.prompt)  # checks the template


_FROZEN = []  # set once this process has frozen what it loaded
# The collector's thresholds in an env actor's process: a young collection once every this many allocations, not
# 700 (Python's default). A thousand live episodes keep every object of theirs alive across a few moves, so at the
# default most of them were walked again by older collections: a third of a generation-path move's time.
GC_THRESHOLDS = (20_000, 10, 10)


def freeze_what_is_loaded() -> None:
    """Once a process: what is loaded by now (transformers, torch, the games) lives as long as the process, so it
    goes out of the collector's reach (``gc.freeze``, after a collection: no garbage is frozen with it), and a full
    collection no longer walks it: a third of the generation path's time went to those walks. From then on the
    collector runs at ``GC_THRESHOLDS``."""
    if not _FROZEN:
        gc.collect()
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)
        _FROZEN.append(True)


class EnvActor:
    """Training and evaluation episodes on one trio loop (see the module); the launcher wraps it for Ray."""

    def __init__(self, cfg: EnvConfig, name: str = "env"):
        self.cfg, self.name = cfg, name
        self._ids = itertools.count()  # episodes: "<life>/<name>-<incarnation>-<n>" (see ``episode_id``)
        self._rng = random.Random(cfg.seed)  # episode seeds, and the self-play source's draws
        self._admission = Admission(
            cfg.policy_id, max_staleness=cfg.max_staleness, batch_episodes=cfg.batch_episodes,
            slot=cfg.admission_slot, versions=cfg.start_versions or {cfg.policy_id: cfg.start_version},
            offset=cfg.admission_offset, started_before=cfg.started_before)
        self._idle_games = [self._make_game()]  # also checks env_name and env_args now
        self._num_players = self._idle_games[0].num_players
        self._tasks = getattr(self._idle_games[0], "buffer", None)  # a role game's task buffer (envs.task_buffer)
        self._counts = EpisodeCounts(self._num_players)
        self._training = {"train_episodes": 0, "train_return_sum": 0.0,  # the policy's mean return over its seats
                          "train_episodes_without_rows": 0}
        self._evaluations: dict[str, EvaluationTally] = {}
        self._training_on = trio.Event()  # set while training episodes may start
        self._training_in_flight = 0
        self._place_freed = trio.Event()  # set when a training episode in flight is done
        self._episodes_done = Answers()  # training episodes delivered (by learner) or given back (None), to finish
        self._drained = False  # set by ``retire`` once every episode it started is delivered or given back
        self._policy: PolicyClient | None = None
        self._matches: MatchSource | None = None
        self._nursery = None
        self._given_back_ids: dict[str, None] = {}  # dropped episodes given back (oldest first)

    async def run(self, transport, peers: dict, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        from transformers import AutoTokenizer  # heavy: loaded by the actor's process only

        cfg = self.cfg
        tokenizer = await trio.to_thread.run_sync(AutoTokenizer.from_pretrained, cfg.tokenizer_path)
        freeze_what_is_loaded()
        self.codec = TokenCodec(tokenizer)
        budget = move_token_budget(self._idle_games[0], self.codec, cfg.max_new_tokens)
        self._settings = EpisodeSettings(cfg.env_name, budget, cfg.max_prompt_tokens, prompt=cfg.prompt_format,
                                         max_context_tokens=cfg.max_context_tokens, answer=cfg.answer,
                                         format_penalty=cfg.format_penalty,
                                         truncation_penalty=cfg.truncation_penalty)
        PromptRenderer(cfg.prompt_format, self.codec, tokenizer)  # a chat template the tokenizer lacks: said now
        rollouts, rewards = (by_member(peers[key], cfg.policy_id) for key in ("rollout", "reward"))
        topics = [VERSION_TOPIC + member.encode() for member in self._admission.members]
        async with (
            open_policy_client(transport, rollouts, name=self.name, own=cfg.policy_id, temperature=cfg.temperature,
                               min_version=self._admission.version, incarnation=cfg.incarnation,
                               request_deadline_s=cfg.request_deadline_s) as policy,
            transport.open_subscriber(peers.get("versions", []), topics=topics) as versions,
            transport.open_subscriber(peers.get("dropped", []), topics=[dropped_topic(self.name)],
                                      capacity=256) as dropped,
            open_outboxes(transport, rewards, Kind.EPISODES, self.name, capacity=16) as episodes,
            self._open_matches(transport, peers) as matches,
            trio.open_nursery() as nursery,
        ):
            self._episodes = episodes  # per member: its reward actor
            self._deliveries = Deliveries(episodes, self._delivered)  # episodes to them, a batch of tables at a time
            nursery.start_soon(self._deliveries.run)
            nursery.start_soon(self._finish_training, matches)
            self._versions_inbox = Inbox(versions, Kind.VERSION, VersionAnnounced.from_body, topic=True)
            self._policy, self._matches, self._nursery = policy, matches, nursery
            self._lanes = LaneGroup(policy, self.codec, self._settings, self._counts)  # every episode's moves
            nursery.start_soon(self._lanes.run)
            nursery.start_soon(self._admission.follow_versions, self._versions_inbox)
            self._dropped_inbox = Inbox(dropped, Kind.DROPPED, EpisodeDropped.from_body, topic=True)
            nursery.start_soon(self._follow_drops, self._dropped_inbox)
            nursery.start_soon(self._train, matches)
            if self._tasks is not None and cfg.tasks_dir:
                nursery.start_soon(self._keep_tasks, Path(cfg.tasks_dir) / f"{self.name}.arrows")
            task_status.started({"completions": policy.reply_to})

    async def _keep_tasks(self, path: Path) -> None:
        """The task buffer with the run: what an earlier life kept is loaded, and it is saved every TASKS_SAVE_S
        and when the actor stops (atomically: a kill leaves the last save)."""
        if path.exists():
            try:
                log.info("%s: task buffer %s: %s", self.name, path, self._tasks.load(path))
            except ValueError as error:  # not a buffer of ours: the run goes on with what it has
                log.warning("%s: task buffer %s not loaded: %s", self.name, path, error)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            while True:
                await trio.sleep(TASKS_SAVE_S)
                self._tasks.save(path)
        finally:
            self._tasks.save(path)

    async def _follow_drops(self, inbox: Inbox) -> None:
        while True:
            self.episode_dropped(await inbox.receive())

    def episode_dropped(self, notice: EpisodeDropped) -> None:
        """The reward actor or replay dropped one of the episodes this actor delivered: its admission is given
        back, once (notices repeat). A predecessor's episode is not this actor's to give back: a restart counts as
        started only what replay holds of its predecessors' (``started_before``), and a dropped one is not there."""
        own = notice.episode_id.startswith(self._id_prefix) and notice.policy_id in self._admission.members
        if not own or notice.episode_id in self._given_back_ids:
            return
        self._given_back_ids[notice.episode_id] = None
        while len(self._given_back_ids) > GIVEN_BACK_MEMORY:  # notices stop repeating long before these go
            del self._given_back_ids[next(iter(self._given_back_ids))]
        reason = notice.reason if notice.reason in DROP_REASONS else "dropped"
        self._admission.given_back(notice.policy_id, reason)
        if self.cfg.ledger_dir:  # the accounting's: produced, and dropped for a reason, not lost
            append_line(f"{self.cfg.ledger_dir}/{self.name}.dropped", f"{notice.episode_id} {reason}")

    def _open_matches(self, transport, peers: dict):
        """The match source: the league's when ``peers`` names one, else this policy's self-play."""
        if "league" in peers:
            return open_league_matches(transport, peers["league"], name=self.name, members=self._admission.members,
                                       num_players=self._num_players)
        cfg = self.cfg
        return contextlib.nullcontext(SelfPlayMatches(
            cfg.policy_id, self._num_players, self._rng, opponent=cfg.opponent, opponent_share=cfg.opponent_share,
            opponent_seat=cfg.opponent_seat, opponent_seat_decay=cfg.opponent_seat_decay))

    @property
    def learner_version(self) -> int:
        """The version of this actor's own policy's learner (``policy_id``)."""
        return self._admission.version(self.cfg.policy_id)

    @learner_version.setter
    def learner_version(self, version: int) -> None:
        self._admission.set_version(self.cfg.policy_id, version)

    # -- control (called on the actor's loop) ---------------------------------------------------------

    def set_training(self, on: bool) -> None:
        """Start or stop starting new training episodes (episodes in flight finish)."""
        if on:
            self._training_on.set()
        elif self._training_on.is_set():  # a new event only if it was on: ``_train`` may wait on this one
            self._training_on = trio.Event()

    def evaluate(self, tag: str, games_per_seat: int, opponent: str = "random", player: str = POLICY) -> None:
        """Play ``games_per_seat`` games with ``player`` in each seat in turn and ``opponent`` in the others;
        results under ``tag``. ``player`` is the policy, or a fixed opponent's name (to calibrate a measure:
        how does minimax fare against random? or to host games with no model at all)."""
        player = self.cfg.policy_id if player == POLICY else player
        tally = self._evaluations[tag] = EvaluationTally(tag, opponent, games_per_seat)
        seats = range(self._num_players)
        matches = ((seat, seated(player, seat, opponent, self._num_players))
                   for _ in range(games_per_seat) for seat in seats)
        workers = min(self.cfg.concurrency, games_per_seat * len(seats))
        if not workers:
            tally.finish()
        left = [workers]
        for _ in range(workers):
            self._evaluate_next(tally, matches, left)

    def set_rollouts(self, addresses: list[str], member: str | None = None) -> None:
        """Send ``member``'s (default: this actor's own policy's) requests to these rollout actors from now on
        (a scale; see ``PolicyClient``)."""
        self._policy.set_rollouts(addresses, member)

    def rebalance(self, slot: tuple[int, int], delta: int) -> int:
        """A scale of env actors: this actor's admission share and count move (see ``Admission.rebalance``).
        Returns its admission offset, what a restart of it counts beyond the episodes it delivered."""
        return self._admission.rebalance(slot, delta)

    def retire(self) -> None:
        """Leave the run (a scale-down): start no more training episodes, finish those in flight, and once
        the reward actor has acknowledged every one, say ``drained`` in the statistics."""
        self.set_training(False)
        self._nursery.start_soon(self._drain)

    async def _drain(self) -> None:
        while self._training_in_flight:
            await trio.sleep(0.02)
        for outbox in self._episodes.values():
            await outbox.channel.drain()
        self._drained = True

    def reissue(self) -> int:
        """Send again every generation request still unanswered (a rollout actor died with some of them;
        which ones, only it knew). A request answered twice counts once. Returns how many go out."""
        return self._policy.reissue()

    def reissue_match_request(self) -> bool:
        """Send again the match request this actor waits on, if any (the league restarted); True if one goes out."""
        return self._matches.reissue_request()

    def statistics(self) -> EnvStatistics:
        return {
            **self._counts.statistics(), **self._training, **self._admission.statistics(),
            "training_in_flight": self._training_in_flight,
            "drained": self._drained,
            **self._running_statistics(),
            "evaluations": [t.summary() for t in self._evaluations.values()],
            **({"task_buffer": self._tasks.statistics()} if self._tasks is not None else {}),
        }

    def _running_statistics(self) -> dict:
        """What the policy client, the match source and the streams say (zeros before ``run``)."""
        if self._nursery is None:
            return {"reissued_requests": 0, "duplicate_completions": 0, "request_frames": 0, "completion_frames": 0,
                    "live_episodes": 0, "dropped_frames": 0,
                    "stray_matches": 0, "reissued_match_requests": 0, "prompt_cache_hits": 0, "streams": {},
                    "opponent_seat_probabilities": uniform_seats(self._num_players)}
        policy = self._policy.statistics()
        streams = {"completions": policy.pop("completions"), "versions": self._versions_inbox.statistics(),
                   "dropped": self._dropped_inbox.statistics()}
        return {**policy, **self._matches.statistics(), "prompt_cache_hits": self.codec.hits, "streams": streams}

    # -- episodes --------------------------------------------------------------------------------------

    async def _train(self, matches: MatchSource) -> None:
        """Start training episodes, up to ``concurrency`` in flight, while training is on and admission allows; each
        goes on in a lane of the group, and from its end (``_trained``) to its delivery and ``_finish_training``."""
        while True:
            await self._training_on.wait()
            while True:  # every free place at once (no yield between starts: their first moves ask together)
                if not self._training_on.is_set():
                    break
                if self._training_in_flight >= self.cfg.concurrency:
                    self._place_freed = trio.Event()
                    await self._place_freed.wait()
                    break
                admitted = self._admission.admitted()
                if not admitted:
                    await self._admission.wait_for_change()
                    break
                match = await matches.next(admitted)
                self._admission.started(match.learner)
                self._training_in_flight += 1
                self._start(match.seats, match.learner, functools.partial(self._trained, match))

    def _trained(self, match: Match, played: Played) -> None:
        """A training episode's end (on the group's tick): its rows to the learner's reward actor, or, errored or
        over before the learner's turn (an opponent's forfeit with more than two players), never consumed: its
        admission given back."""
        if played is not None and played[0]:
            columns, returns = played
            policy_returns = [r for r, who in zip(returns, match.seats) if who == match.learner]
            self._training["train_episodes"] += 1
            self._training["train_return_sum"] += sum(policy_returns) / len(policy_returns)
            self._deliveries.post(match.learner, columns.table_columns(), (match, played))
            return
        self._admission.given_back(match.learner, "errored" if played is None else "without_rows")
        self._training["train_episodes_without_rows"] += played is not None
        self._episodes_done.put(None, (match, played))

    def _delivered(self, learner: str, sent: list[tuple[tuple[Match, Played], Exception | None]]) -> None:
        for (match, played), failure in sent:
            self._episodes_done.put(learner, (match, played) if failure is None else failure)

    async def _finish_training(self, matches: MatchSource) -> None:
        """Training episodes delivered or given back, a batch at a time: the delivered ones in the ledger once their
        reward actor has them, every one told to the match source, and its place in flight freed."""
        while True:
            await self._episodes_done.wait()
            done = self._episodes_done.take()
            if self.cfg.ledger_dir:
                delivered = [(learner, finished[1][0].shared[Columns.EPISODE_ID]) for learner, finished in done
                             if learner is not None and not isinstance(finished, Exception)]
                for learner in dict.fromkeys(learner for learner, _ in delivered):
                    await self._episodes[learner].channel.drain()  # the reward actor has them, and replay before
                    # it acknowledged: then the ledger's lines (whole lines, even on a full disk)
                    for who, episode_id in delivered:
                        if who == learner:
                            append_line(f"{self.cfg.ledger_dir}/{self.name}.txt", episode_id)
            for _, finished in done:
                if isinstance(finished, Exception):  # rows that do not fit the schema: a bug, raised here
                    raise finished
                await matches.finished(*finished)
                self._training_in_flight -= 1
                self._place_freed.set()

    def _evaluate_next(self, tally: EvaluationTally, matches: Iterator[tuple[int, list[str]]], left: list[int]) -> None:
        """The next match of an evaluation in a lane, or, none left, one player fewer (``left``: how many are still
        playing); the last one finishes the tally. So every match is played exactly once, at most ``workers`` at a
        time, each started as the one before it ends."""
        match = next(matches, None)
        if match is None:
            left[0] -= 1
            if not left[0]:
                tally.finish()
            return
        seat, seats = match
        self._start(seats, seats[seat], functools.partial(self._evaluated, tally, matches, left, seat))

    def _evaluated(self, tally: EvaluationTally, matches: Iterator, left: list[int], seat: int, played: Played) -> None:
        if played is not None:  # an errored game is counted in statistics()["errored"], not as a result
            tally.add(seat, played[1], played[0])
        self._evaluate_next(tally, matches, left)

    def _start(self, seats: list[str], learner: str, ended: Callable[[Played], None]) -> None:
        """One episode in a lane of the group, on an idle game: a finished game is reset and reused (making one can
        cost more than playing it); one that raised is not."""
        seed = self._rng.randrange(2**31)
        game = self._idle_games.pop() if self._idle_games else self._make_game()

        def game_back(played: Played) -> None:
            if played is not None:
                self._idle_games.append(game)
            ended(played)

        self._lanes.start(game, seats, episode_id=self.episode_id(), seed=seed, learner=learner, ended=game_back)

    def episode_id(self) -> str:
        """A new episode's id, ``<life>/<name>-<incarnation>-<n>``: never the same twice in a run directory."""
        return f"{self._id_prefix}{next(self._ids)}"

    @functools.cached_property
    def _id_prefix(self) -> str:
        """What the ids of this actor's episodes (this incarnation's, in this life of the run) begin with."""
        own = f"{self.name}-{self.cfg.incarnation}-"
        return f"{self.cfg.life}/{own}" if self.cfg.life else own

    def _make_game(self):
        cfg = self.cfg
        return make(cfg.env_name, invalid_penalty=cfg.invalid_penalty, max_retries=cfg.max_retries,
                    retry_penalty=cfg.retry_penalty, **cfg.env_args)
