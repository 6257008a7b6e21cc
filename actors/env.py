"""EnvActor: runs many live episodes, each a trio task, and asks rollout actors for the policy's moves.

Any environment ``envs.make`` knows: n-player turn-based games, and single-agent multi-turn tasks (GEM's
interface) seated as one-player games. A step may be a coroutine (a slow tool): the episode waits, the
others go on. Invalid actions cost a penalty, a retry, then a forfeit (``envs.invalid``), all counted. An
environment that raises loses its episode only: it is logged with its traceback and counted as errored.

Training episodes seat the policy in every seat (mirror self-play; optionally a share of them against a
fixed opponent) and go to the reward actor when they end. Admission keeps them fresh (AReaL's rule): a
new training episode starts only while the episodes started but not yet consumed by the learner number
fewer than (max_staleness + v + 1) * batch_episodes, v being the learner's version, announced on its
publisher. With n env actors the allowance A is split exactly: actor i of n gets ceil((A - i) / n) of it
(``admission_share``), so the shares add up to A; a scale of env actors shares it again (``rebalance``).
Every generation request carries the learner version this actor knows of as ``min_version``: the rollout
actor waits for those weights rather than sample with older ones, so with max_staleness = 0 training is
exactly on-policy.

Evaluation episodes seat the policy against a fixed opponent in each seat in turn; their results are kept
in ``statistics()["evaluations"]`` and never trained on.

A restarted env actor (``incarnation`` > 0) names its episodes and requests apart from its predecessor's (an
answer to a dead actor's request is dropped as a stray), and counts as started what its predecessors delivered
(``started_before``, per member, from replay): their episodes still in flight died with them and are replaced
by new ones. In a league, a match request the league took and did not answer before it died goes out again
(``reissue_match_request``).
With a ``ledger_dir`` each training episode's id is appended to ``<ledger_dir>/<name>.txt`` once the reward actor
has acknowledged it: the chaos benchmark's record of what was produced.

In a league (``peers`` holds ``league``, and ``rollout``/``reward`` map each member to its group), training
matches come from the LeagueActor: the env actor asks for one naming the members it may admit (admission is
kept per member, against that member's learner version), plays it with each seat's generation requests sent
to the rollout group of the seat's member (a snapshot ``<member>-v<n>`` is served by its member's group),
sends the learner's rows to that member's reward actor, and reports the returns to the league. Only the
seats of the match's learner are trained on; the others (other members, snapshots, fixed opponents) play.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Iterator

import trio

from streams.endpoints import Inbox, Outbox
from actors.evaluation import EvaluationTally
from actors.leagues.matchmaking import WEIGHTINGS, Payoff, draw, pairwise_scores, pfsp_probabilities
from envs.base import StepResult
from actors.engines.snapshots import parse_snapshot_id
from envs.registry import OPPONENTS, make, make_opponent
from streams.messages import VERSION_TOPIC, Completion, GenerationRequest, MatchAssigned, MatchRequest, MatchResult, \
    VersionAnnounced
from streams.schema import Columns, encode_table, trajectory_table
from streams.wire import Kind

log = logging.getLogger(__name__)
POLICY = "policy"
FIXED_MOVES_PER_CHECKPOINT = 8  # moves of fixed players (no await of their own) between yields


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
    max_staleness: int = 2  # eta: how many versions behind the learner a started episode may fall
    batch_episodes: int = 64  # the learner's batch size B, for admission
    admission_slot: tuple[int, int] = (0, 1)  # (i, n): this actor is i of n sharing the admission allowance
    start_version: int = 0  # the learner's version when this actor starts (a resumed run's checkpoint)
    start_versions: dict = field(default_factory=dict)  # a league: each member's start version
    opponent: str = "random"  # the fixed opponent of the training games below
    opponent_share: float = 0.0  # fraction of training games against ``opponent`` instead of the mirror
    # The policy's seat in those games: "uniform", or a PFSP weighting (actors.leagues.matchmaking: hard, variance,
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

    def __post_init__(self):
        if self.policy_id in OPPONENTS:
            raise ValueError(f"policy_id {self.policy_id!r} is the name of a fixed opponent; choose another")
        if self.opponent_seat != "uniform" and self.opponent_seat not in WEIGHTINGS:
            raise ValueError(f"opponent_seat {self.opponent_seat!r}: choose uniform or a PFSP weighting "
                             f"({', '.join(WEIGHTINGS)})")
        Payoff(self.opponent_seat_decay)  # checks the decay


class EnvActor:
    def __init__(self, cfg: EnvConfig, name: str = "env"):
        self.cfg, self.name = cfg, name
        self._ids = itertools.count()  # episodes: "<name>-<incarnation>-<n>"
        self._request_ids = itertools.count(cfg.incarnation << 40)  # apart from any predecessor's
        self._rng = random.Random(cfg.seed)
        self._waiting: dict[int, tuple[trio.Event, list, bytes, str]] = {}  # id -> (done, completion, request, group)
        self._evaluations: dict[str, EvaluationTally] = {}
        self._fixed_moves = 0  # moves played by fixed players, for FIXED_MOVES_PER_CHECKPOINT
        self._stats = {"episodes": 0, "steps": 0, "turns": 0, "invalid_actions": 0, "forfeits": 0, "errored": 0,
                       "truncated_actions": 0, "truncated_prompts": 0, "admission_waits": 0,
                       "train_episodes": 0, "train_return_sum": 0.0,  # the policy's mean return over its seats
                       "reissued_requests": 0, "duplicate_completions": 0,
                       "train_episodes_without_rows": 0, "refused_generations": 0, "stray_matches": 0,
                       "reissued_match_requests": 0}
        self._match_request: dict | None = None  # the league's match request this actor waits on
        # Per learning member: its learner's version, and the training episodes started and not dropped (a
        # resumed run counts the episodes its learner consumed).
        self._versions = dict(cfg.start_versions or {cfg.policy_id: cfg.start_version})
        self._started = {m: self._share(v * cfg.batch_episodes) for m, v in self._versions.items()}
        if cfg.admission_offset is not None:
            self._started[cfg.policy_id] = cfg.admission_offset
        self._admission_offset = self._started[cfg.policy_id]  # see ``rebalance``
        for member, delivered in cfg.started_before.items():
            self._started[member] += delivered
        self._training_in_flight = 0
        self._drained = False  # set by ``retire`` once every episode it started is delivered or given back
        self._idle_games = [self._make_game()]  # also checks env_name and env_args now
        self._return_sums = [0.0] * self._idle_games[0].num_players
        self._seat_scores = Payoff(cfg.opponent_seat_decay)  # "seat<i>" against cfg.opponent, training games
        self._nursery = None

    async def run(self, transport, peers: dict, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = await trio.to_thread.run_sync(AutoTokenizer.from_pretrained, self.cfg.tokenizer_path)
        self.codec = TokenCodec(self.tokenizer)
        self._max_new_tokens = move_token_budget(self._idle_games[0], self.codec, self.cfg.max_new_tokens)
        self._training_on = trio.Event()  # set while training episodes may start
        self._admission_changed = trio.Event()
        rollouts, rewards = (by_member(peers[key], self.cfg.policy_id) for key in ("rollout", "reward"))
        topics = [VERSION_TOPIC + member.encode() for member in self._versions]
        async with (
            transport.open_receiver(capacity=1024) as completions,
            transport.open_subscriber(peers.get("versions", []), topics=topics) as versions,
            contextlib.AsyncExitStack() as stack,  # one sender per rollout group and reward actor, opened here
        ):
            self._requests = {m: Outbox(await stack.enter_async_context(transport.open_sender(a, capacity=1024)),
                                        Kind.GENERATE, self.name) for m, a in rollouts.items()}
            self._episodes = {m: Outbox(await stack.enter_async_context(transport.open_sender(a, capacity=16)),
                                        Kind.EPISODES, self.name) for m, a in rewards.items()}
            self._rollouts = list(rollouts[self.cfg.policy_id])  # the own group's actors: a scale changes them
            if "league" in peers:
                await self._open_league(transport, peers["league"], stack)
            async with trio.open_nursery() as nursery:
                self._reply_to = completions.address
                self._completions = Inbox(completions, Kind.COMPLETION, Completion.from_body)
                self._nursery = nursery
                nursery.start_soon(self._route_completions)
                self._versions_inbox = Inbox(versions, Kind.VERSION, VersionAnnounced.from_body, topic=True)
                nursery.start_soon(self._follow_versions, self._versions_inbox)
                nursery.start_soon(self._train)
                task_status.started({"completions": completions.address})

    async def _open_league(self, transport, league: dict, stack: contextlib.AsyncExitStack) -> None:
        matches = await stack.enter_async_context(transport.open_receiver(capacity=4))
        requests = await stack.enter_async_context(transport.open_sender([league["requests"]], capacity=4))
        results = await stack.enter_async_context(transport.open_sender([league["results"]], capacity=256))
        self._league = {"reply_to": matches.address, "matches": Inbox(matches, Kind.MATCH, MatchAssigned.from_body),
                        "requests": Outbox(requests, Kind.MATCH_REQUEST, self.name),
                        "results": Outbox(results, Kind.MATCH_RESULT, self.name)}

    @property
    def learner_version(self) -> int:
        """The version of this actor's own policy's learner (``policy_id``)."""
        return self._versions.get(self.cfg.policy_id, 0)

    @learner_version.setter
    def learner_version(self, version: int) -> None:
        self._versions[self.cfg.policy_id] = version

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
        seats = range(len(self._return_sums))
        matches = ((seat, self._seats(opponent, seat, player)) for _ in range(games_per_seat) for seat in seats)
        workers = min(self.cfg.concurrency, games_per_seat * len(seats))
        self._nursery.start_soon(self._evaluate, tally, matches, workers)

    def set_rollouts(self, addresses: list[str]) -> None:
        """Send requests to these rollout actors from now on (a scale): joining ones take work at once; a
        leaving one is sent nothing more, and what it was sent and had not acknowledged is dropped here: the
        launcher calls ``reissue`` once it is gone, and an answer that still comes is counted once."""
        sender = self._requests[self.cfg.policy_id].channel
        for address in set(self._rollouts) - set(addresses):
            sender.disconnect(address)
        for address in addresses:
            if address not in self._rollouts:
                sender.connect(address)
        self._rollouts = list(addresses)

    def rebalance(self, slot: tuple[int, int], delta: int) -> int:
        """A scale of env actors: from now on this actor is ``slot`` = (i, n) of the n sharing the admission
        allowance, and its count of started episodes moves by ``delta`` (the launcher spreads the run's total
        over the new shares, training paused meanwhile, so the shares still add up to the total exactly).
        Returns its admission offset, what a restart of it counts beyond the episodes it delivered."""
        i, n = slot
        if not 0 <= i < n:
            raise ValueError(f"admission slot {slot!r}: need 0 <= i < n")
        self.cfg.admission_slot = (i, n)
        self._started[self.cfg.policy_id] += delta
        self._admission_offset += delta
        self._admission_moved()
        return self._admission_offset

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
        unanswered = [request_id for request_id, (_, slot, _, _) in self._waiting.items() if not slot]
        self._nursery.start_soon(self._reissue, unanswered)
        return len(unanswered)

    def reissue_match_request(self) -> bool:
        """Send again the match request this actor waits on, if any (the league restarted, and the request may
        have died with it unanswered); a second answer is dropped as a stray. True if one goes out."""
        if self._match_request is None:
            return False
        self._nursery.start_soon(self._league["requests"].send, self._match_request)
        self._stats["reissued_match_requests"] += 1
        return True

    def statistics(self) -> dict:
        episodes = max(self._stats["episodes"], 1)
        return {
            **self._stats,
            "live_episodes": len(self._waiting),
            "started": sum(self._started.values()),
            "admission_offset": self._admission_offset,
            "admission_slot": list(self.cfg.admission_slot),
            "training_in_flight": self._training_in_flight,
            "drained": self._drained,
            "learner_version": self.learner_version,
            "admission_limit": sum(map(self._admission_limit, self._started)),
            "versions": dict(self._versions),
            **{f"mean_return_seat{seat}": total / episodes for seat, total in enumerate(self._return_sums)},
            "opponent_seat_probabilities": self._opponent_seat_probabilities(),
            "prompt_cache_hits": self.codec.hits if self._nursery else 0,
            "dropped_frames": self._completions.statistics()["dropped_frames"] if self._nursery else 0,
            "streams": {"completions": self._completions.statistics(), "versions": self._versions_inbox.statistics()}
            if self._nursery else {},
            "evaluations": [t.summary() for t in self._evaluations.values()],
        }

    # -- episodes --------------------------------------------------------------------------------------

    def _admission_limit(self, member: str) -> int:
        return self._share((self.cfg.max_staleness + self._versions[member] + 1) * self.cfg.batch_episodes)

    def _share(self, allowance: int) -> int:
        """This actor's exact share of ``allowance`` among the env actors."""
        return admission_share(allowance, *self.cfg.admission_slot)

    async def _follow_versions(self, inbox: Inbox) -> None:
        while True:
            announced = await inbox.receive()
            if announced.version > self._versions.get(announced.policy_id, announced.version):
                self._versions[announced.policy_id] = announced.version
                self._admission_moved()

    def _admission_moved(self) -> None:
        """Wake ``_train`` if it waits for admission: a new learner version, or new shares."""
        self._admission_changed.set()
        self._admission_changed = trio.Event()

    async def _train(self) -> None:
        slots = trio.Semaphore(self.cfg.concurrency)
        async with trio.open_nursery() as nursery:
            while True:
                await self._training_on.wait()
                await slots.acquire()
                # decided once the slot is free: training may have stopped, or the shares moved, meanwhile
                if not self._training_on.is_set():
                    slots.release()
                    continue
                admitted = [m for m, started in self._started.items() if started < self._admission_limit(m)]
                if not admitted:
                    slots.release()
                    self._stats["admission_waits"] += 1
                    await self._admission_changed.wait()
                    continue
                match = await self._next_match(admitted)
                self._started[match.learner] += 1
                self._training_in_flight += 1
                nursery.start_soon(self._train_one, slots, match)

    async def _next_match(self, admitted: list[str]) -> MatchAssigned:
        """The league's next match for one of the ``admitted`` members; without a league, this policy's
        mirror self-play or its game against the fixed opponent."""
        if not hasattr(self, "_league"):
            return MatchAssigned(-1, -1, self.cfg.policy_id, self._training_seats())
        request_id = next(self._ids)
        self._match_request = MatchRequest(request_id, self._league["reply_to"], admitted).to_body()
        await self._league["requests"].send(self._match_request)
        while (match := await self._league["matches"].receive()).request_id != request_id:
            self._stats["stray_matches"] += 1
        self._match_request = None
        if match.learner not in self._started or len(match.seats) != len(self._return_sums):
            raise ValueError(f"the league assigned match {match.match_id} for {match.learner!r} with "
                             f"{len(match.seats)} seats; this actor admits {sorted(self._started)} in "
                             f"{len(self._return_sums)}-seat games")
        return match

    def _seats(self, opponent: str, seat: int, player: str = POLICY) -> list[str]:
        """``player`` (the policy, by default) in ``seat``, ``opponent`` in every other seat."""
        return [player if s == seat else opponent for s in range(len(self._return_sums))]

    def _training_seats(self) -> list[str]:
        """Mirror self-play, or (a share ``opponent_share`` of games) the policy in one seat against the opponent."""
        if self._rng.random() >= self.cfg.opponent_share:
            return [self.cfg.policy_id] * len(self._return_sums)
        seat = int(draw(self._opponent_seat_probabilities(), self._rng))
        return self._seats(self.cfg.opponent, seat, self.cfg.policy_id)

    def _opponent_seat_probabilities(self) -> dict[str, float]:
        """Seat (as a string) -> probability that the policy sits there in a game against the fixed opponent."""
        seats = [str(seat) for seat in range(len(self._return_sums))]
        if self.cfg.opponent_seat == "uniform":
            return {seat: 1.0 / len(seats) for seat in seats}
        scores = {seat: self._seat_scores.win_rate(seat, self.cfg.opponent) for seat in seats}
        return pfsp_probabilities(scores, self.cfg.opponent_seat)

    def _score_opponent_game(self, seats: list[str], returns: list[float]) -> None:
        """A training game of the policy in one seat against the fixed opponent: its score there (as the
        league scores a match), for ``opponent_seat``."""
        seat = str(seats.index(self.cfg.policy_id))
        for opponent, score in pairwise_scores(seats, returns, self.cfg.policy_id):
            self._seat_scores.add(seat, opponent, score)

    async def _train_one(self, slots: trio.Semaphore, match: MatchAssigned) -> None:
        try:
            seats, learner = match.seats, match.learner
            played = await self._play(seats, self._rng.randrange(2**31), learner=learner)
            if played is not None and played[0]:
                policy_returns = [r for r, who in zip(played[1], seats) if who == learner]
                self._stats["train_episodes"] += 1
                self._stats["train_return_sum"] += sum(policy_returns) / len(policy_returns)
                if match.match_id < 0 and self.cfg.opponent in seats:
                    self._score_opponent_game(seats, played[1])
                await self._episodes[learner].send(encode_table(trajectory_table(played[0])))
                if self.cfg.ledger_dir:
                    await self._record_delivery(learner, played[0][0][Columns.EPISODE_ID])
            else:  # errored, or over before the learner's turn (an opponent's forfeit with more than two
                self._started[learner] -= 1  # players): never consumed, so it gives its admission back
                self._stats["train_episodes_without_rows"] += played is not None
            if match.match_id >= 0:
                returns = played[1] if played is not None else [0.0] * len(seats)
                result = MatchResult(match.match_id, learner, seats, returns, errored=played is None)
                await self._league["results"].send(result.to_body())
        finally:
            self._training_in_flight -= 1
            slots.release()

    async def _record_delivery(self, learner: str, episode_id: str) -> None:
        await self._episodes[learner].channel.drain()  # the reward actor has it, and replay before it acknowledged
        with open(f"{self.cfg.ledger_dir}/{self.name}.txt", "a") as f:
            f.write(episode_id + "\n")

    async def _evaluate(self, tally: EvaluationTally, matches: Iterator[tuple[int, list[str]]], workers: int) -> None:
        """``workers`` long-lived tasks share ``matches``: each plays the next one as soon as its game ends, so
        every match is played exactly once, at most ``workers`` at a time, with no task started per game."""

        async def worker():
            for seat, seats in matches:  # next() never awaits: no two workers take the same match
                played = await self._play(seats, self._rng.randrange(2**31), learner=seats[seat])
                if played is not None:  # an errored game is counted in statistics()["errored"], not as a result
                    tally.add(seat, played[1], played[0])

        async with trio.open_nursery() as nursery:
            for _ in range(workers):
                nursery.start_soon(worker)
        tally.finish()

    def _make_game(self):
        cfg = self.cfg
        return make(cfg.env_name, invalid_penalty=cfg.invalid_penalty, max_retries=cfg.max_retries,
                     retry_penalty=cfg.retry_penalty, **cfg.env_args)

    async def _play(self, seats: list[str], seed: int,
                    learner: str | None = None) -> tuple[list[dict], list[float]] | None:
        """One episode: the agent-turn rows of ``learner``'s seats and every seat's return. A seat is a policy
        (a member or a snapshot: generated) or a fixed opponent's name.

        None: the environment raised. An episode whose first turns fell behind the staleness bound plays on: its
        later turns are sampled with the newest weights, and the learner drops only the turns too old to train.
        """
        episode_id = f"{self.name}-{self.cfg.incarnation}-{next(self._ids)}"
        try:
            return await self._play_episode(episode_id, seats, seed, learner)
        except GenerationRefused as refused:
            log.warning("episode %s dropped: %s", episode_id, refused)
            self._stats["errored"] += 1
            self._stats["refused_generations"] += 1
            return None
        except Exception:  # the environment's (or an opponent's) bug costs this episode only
            log.exception("environment %s raised in episode %s; the episode is dropped", self.cfg.env_name,
                          episode_id)
            self._stats["errored"] += 1
            return None

    async def _play_episode(self, episode_id: str, seats: list[str], seed: int,
                            learner: str | None) -> tuple[list[dict], list[float]]:
        # a finished game is reset and reused (making one can cost more than playing it); a raising one is not
        game = self._idle_games.pop() if self._idle_games else self._make_game()
        game.reset(seed)
        fixed = [make_opponent(name, seed=seed + s) if name in OPPONENTS else None for s, name in enumerate(seats)]
        episode = self._episode_columns(episode_id, seats, seed, learner) if None in fixed else None  # rows share it
        credit = RewardCredit(game.num_players)
        for turn in itertools.count():
            seat = game.current_player
            player = fixed[seat]
            if player is None:
                row = {**episode, Columns.TURN: turn, Columns.AGENT: seat}
                result = await self._policy_move(game, row, credit, seats[seat], seats[seat] == learner)
            else:
                result = await _step(game, player.act(game), credit)
                self._fixed_moves += 1
                if not self._fixed_moves % FIXED_MOVES_PER_CHECKPOINT:  # rules alone still let the others run
                    await trio.lowlevel.checkpoint()
            self._stats["steps"] += 1
            if result.terminated or result.truncated:
                break
        credit.finish(result)
        self._idle_games.append(game)
        self._stats["episodes"] += 1
        for s, r in enumerate(credit.returns):
            self._return_sums[s] += r
        return credit.rows, credit.returns

    async def _policy_move(self, game, row: dict, credit: RewardCredit, policy: str, trained: bool) -> StepResult:
        """``policy``'s move in seat ``row[AGENT]``: asked of its rollout group and played; its row is added to
        ``credit`` when ``trained`` (the learner's seats), else it only plays."""
        row = await self._policy_turn(game.observation(row[Columns.AGENT]), row, getattr(game, "max_tokens", None),
                                      policy)
        if trained:
            credit.add_row(row)
        result = await _step(game, row[Columns.ACTION_TEXT], credit)
        row[Columns.INVALID_ACTION] = result.invalid
        self._stats["invalid_actions"] += result.invalid
        self._stats["forfeits"] += "forfeit" in result.info
        return result

    def _episode_columns(self, episode_id: str, seats: list[str], seed: int, learner: str | None) -> dict:
        """What every row of an episode shares."""
        return {
            Columns.EPISODE_ID: episode_id, Columns.ENV_NAME: self.cfg.env_name,
            Columns.SEED: seed, Columns.POLICY_ID: learner or self.cfg.policy_id, Columns.CREATED_AT: time.time(),
            Columns.MATCHUP: ",".join(seats),
        }

    async def _policy_turn(self, prompt: str, row: dict, max_tokens: int | None, policy: str) -> dict:
        """Ask the policy for a move; ``row`` holds the episode's and the turn's columns so far."""
        prompt_ids = self.codec.encode(prompt)
        if self.cfg.max_prompt_tokens and len(prompt_ids) > self.cfg.max_prompt_tokens:
            prompt_ids = prompt_ids[-self.cfg.max_prompt_tokens:]
            self._stats["truncated_prompts"] += 1
        completion = await self._generate(prompt_ids, max_tokens or self._max_new_tokens, policy)
        self._stats["turns"] += 1
        self._stats["truncated_actions"] += not completion.finished
        return {
            **row, Columns.PROMPT_IDS: prompt_ids, Columns.ACTION_IDS: completion.token_ids,
            Columns.ACTION_TEXT: self.codec.decode(completion.token_ids),
            Columns.BEHAVIOUR_LOGPROBS: completion.logprobs, Columns.POLICY_VERSIONS: completion.versions,
            Columns.REWARD: 0.0, Columns.TERMINATED: False, Columns.TRUNCATED: False,
            Columns.EPISODE_RETURN: 0.0, Columns.INVALID_ACTION: False,
            Columns.GENERATED_AT: time.time(), Columns.SCORED_AT: 0.0,
        }

    async def _generate(self, prompt_ids: list[int], max_tokens: int, policy: str) -> Completion:
        """A completion from ``policy``'s rollout group: a live member's at least at the version this actor
        knows of; a snapshot's (frozen) from its member's group, at any version."""
        request_id = next(self._request_ids)
        done, slot = trio.Event(), []
        snapshot = parse_snapshot_id(policy) if policy not in self._requests else None
        group = snapshot[0] if snapshot else policy
        if group not in self._requests:
            raise ValueError(f"no rollout group serves policy {policy!r} (groups: {sorted(self._requests)})")
        body = GenerationRequest(request_id, self._reply_to, policy, prompt_ids, self.cfg.temperature, max_tokens,
                                 0 if snapshot else self._versions.get(policy, 0)).to_body()
        self._waiting[request_id] = (done, slot, body, group)
        try:
            await self._requests[group].send(body)
            await done.wait()
        finally:
            self._waiting.pop(request_id, None)
        if slot[0].error:
            raise GenerationRefused(f"the rollout actor refused generation request {request_id}: {slot[0].error}")
        return slot[0]

    async def _route_completions(self) -> None:
        while True:
            completion = await self._completions.receive()
            waiter = self._waiting.get(completion.request_id)
            if waiter is None or waiter[1]:  # a reissued request answered twice, or a stray: the first counts
                self._stats["duplicate_completions"] += 1
                continue
            waiter[1].append(completion)
            waiter[0].set()

    async def _reissue(self, request_ids: list[int]) -> None:
        for request_id in request_ids:
            _, slot, body, group = self._waiting.get(request_id, (None, True, None, None))
            if not slot:  # answered (or ended) since reissue() was called: nothing to send
                await self._requests[group].send(body)
                self._stats["reissued_requests"] += 1


def move_token_budget(game, codec: TokenCodec, configured: int) -> int:
    """Tokens a turn may generate: ``configured``, raised (with a log line) to fit the game's longest move and
    EOS when the game lists its moves (``action_vocabulary()``), so that no legal move is cut off as invalid."""
    vocabulary = getattr(game, "action_vocabulary", None)
    if vocabulary is None:
        return configured
    longest = max(vocabulary(), key=lambda action: len(codec.encode(action)), default="")
    needed = len(codec.encode(longest)) + 1  # and EOS
    if needed > configured:
        log.info("max_new_tokens=%d leaves no room for %s's longest move %r (%d tokens and EOS): generating up to %d",
                 configured, getattr(game, "name", "the game"), longest, needed - 1, needed)
    return max(configured, needed)


def admission_share(allowance: int, i: int, n: int) -> int:
    """Env actor i of n's share of ``allowance`` A: the episodes k < A with k mod n = i, ceil((A - i) / n). The n
    shares add up to exactly A, and none shrinks as A grows (so a count spread as shares of a total within the
    allowance stays within each share)."""
    return (allowance - i + n - 1) // n


def by_member(peers: list[str] | dict[str, list[str]], policy_id: str) -> dict[str, list[str]]:
    """Addresses per learning member: a league's map as it is, one policy's list under its id."""
    return dict(peers) if isinstance(peers, dict) else {policy_id: list(peers)}


async def _step(game, action: str, credit: RewardCredit) -> StepResult:
    """Play ``action``; a coroutine step (a tool that waits) is awaited. Its rewards go to ``credit``."""
    result = game.step(action)
    if not isinstance(result, StepResult):
        result = await result
    credit.add_rewards(result.rewards)
    return result


class GenerationRefused(Exception):
    """The rollout actor could not sample a request (e.g. vLLM refuses temperatures above 2): the episode
    that asked is dropped, with the reason in the log, and counted as errored."""


class TokenCodec:
    """Prompts to token ids and actions to text, through the fast tokenizer's core when there is one.

    Prompts repeat (instructions, first observations, templated feedback), so their ids are cached by text
    (``cache_size`` of them, least recently used out): the same ids ``tokenizer(prompt)`` gives.
    """

    def __init__(self, tokenizer, cache_size: int = 8192):
        core = tokenizer.backend_tokenizer if getattr(tokenizer, "is_fast", False) else None
        if core is not None:
            self._encode_new = lambda text: tuple(core.encode(text).ids)
            self.decode = lambda ids: core.decode(ids, skip_special_tokens=True)
        else:
            self._encode_new = lambda text: tuple(tokenizer(text)["input_ids"])
            self.decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)
        self._cached = functools.lru_cache(maxsize=cache_size)(self._encode_new)

    def encode(self, text: str) -> list[int]:
        return list(self._cached(text))

    @property
    def hits(self) -> int:
        return self._cached.cache_info().hits


class RewardCredit:
    """The policy's rows of one episode, and each reward credited to the row of the seat's last action.

    A reward a seat gets before it has acted goes to its first row. ``finish`` writes every row's
    ``episode_return`` and marks each seat's last row with how the episode ended.
    """

    def __init__(self, num_players: int):
        self.rows: list[dict] = []
        self.returns = [0.0] * num_players
        self._last: dict[int, dict] = {}
        self._pending = [0.0] * num_players

    def add_row(self, row: dict) -> None:
        seat = row[Columns.AGENT]
        row[Columns.REWARD] = self._pending[seat]
        self._pending[seat] = 0.0
        self._last[seat] = row
        self.rows.append(row)

    def add_rewards(self, rewards: list[float]) -> None:
        for seat, reward in enumerate(rewards):
            self.returns[seat] += reward
            if seat in self._last:
                self._last[seat][Columns.REWARD] += reward
            else:
                self._pending[seat] += reward

    def finish(self, result) -> None:
        for row in self.rows:
            row[Columns.EPISODE_RETURN] = self.returns[row[Columns.AGENT]]
        for row in self._last.values():
            row[Columns.TERMINATED], row[Columns.TRUNCATED] = result.terminated, result.truncated
