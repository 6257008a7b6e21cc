"""LeagueActor: the population of a self-play league, who plays whom, and how they fare.

It owns the learning members (id and role), the frozen snapshots taken of them, a payoff matrix of decayed
win rates (``matchmaking.Payoff``) and every player's rating (OpenSkill's Plackett-Luce model: no rating
maths of our own). Env actors ask it for a match (``MatchRequest``, naming the members they may start a
training episode for) and it answers with the seats (``MatchAssigned``), drawn by the member's role
(``matchmaking.choose_opponent``); when the match ends the env actor sends a ``MatchResult`` and the league
updates payoff and ratings. Between learner versions the run's driver tells it the members' versions
(``observe``), which names the members due for a snapshot and, for an exploiter, whether its learner resets it to
the base model once the snapshot is written (``reset_after_snapshot``); the learner writes it and the driver
registers it (``add_snapshot``, checked against its checksums first).

Its state (population, snapshots, payoff, ratings and their history, match counts, evaluations) is written
to ``<state_dir>/league_state.json`` every ``save_every_s`` and when it stops, atomically (a new file renamed
over the old), so a killed run resumes its league with its ratings as they were last written.

A result is checked before it is journaled (``matchmaking.result_problem``): one whose learner is no member or
holds no seat, with the wrong number of seats, or with a non-finite return is rejected, counted by reason and
logged at a bounded rate; a journal entry that fails the same check on resume is skipped, and counted.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import trio

from streams.endpoints import Inbox
from actors.league.face import LeagueStatistics
from actors.league.matchmaking import ROLES, MatchmakingConfig, Payoff, check_reset_probabilities, choose_opponent, \
    pairwise_scores, reset_after_snapshot, result_problem, seat_match, snapshot_due
from actors.models.snapshots import SnapshotError, verify_snapshot
from envs.registry import OPPONENTS
from streams.messages import MatchAssigned, MatchRequest, MatchResult
from streams.replies import open_replies
from streams.values import Rejections
from streams.wire import FRAME_LIMITS, Kind

log = logging.getLogger(__name__)
STATE_FILE = "league_state.json"
JOURNAL_FILE = "league_results.jsonl"  # every match result, appended before it is rated


@dataclass
class LeagueConfig:
    members: list[dict]  # each {"id", "role"}: the learning members
    state_dir: str  # league_state.json goes here
    players: int = 2  # seats of the game
    matchmaking: MatchmakingConfig = field(default_factory=MatchmakingConfig)  # a dict is accepted
    payoff_decay: float = 0.99
    snapshot_every_versions: int = 20  # freeze a member every this many learner versions ...
    snapshot_min_versions: int = 5  # ... or, this many versions after its last snapshot at the earliest, ...
    snapshot_win_rate: float | None = 0.7  # ... once it wins this often against the league's snapshots
    # role -> probability that a member of that role starts again from the base model once its snapshot is taken
    # (AlphaStar: main exploiters always, league exploiters with 0.25); {} turns resets off
    reset_after_snapshot: dict = field(default_factory=lambda: {"main_exploiter": 1.0, "league_exploiter": 0.25})
    history_every_matches: int = 50  # the ratings are recorded (for the ratings-over-time plot) this often
    save_every_s: float = 5.0
    resume: bool = False  # continue from state_dir/league_state.json
    seed: int = 0

    def __post_init__(self):
        if isinstance(self.matchmaking, dict):
            self.matchmaking = MatchmakingConfig(**self.matchmaking)
        ids = [m.get("id") for m in self.members]
        if not ids or len(set(ids)) != len(ids) or not all(isinstance(i, str) and i for i in ids):
            raise ValueError(f"league members need distinct, non-empty ids, not {ids}")
        for member in self.members:
            if member.get("role") not in ROLES:
                raise ValueError(f"league member {member['id']!r}: role {member.get('role')!r} is not one of "
                                 f"{', '.join(ROLES)}")
            if member["id"] in OPPONENTS or "-v" in member["id"] or "," in member["id"]:
                raise ValueError(f"league member id {member['id']!r} is a fixed opponent's name or holds '-v' or "
                                 "',' (reserved for snapshot ids and matchups)")
        if not any(m["role"] == "main" for m in self.members):
            raise ValueError("a league needs at least one member with role 'main'")
        unknown = [o for o in self.matchmaking.fixed_opponents if o not in OPPONENTS]
        if unknown:
            raise ValueError(f"unknown fixed opponents {unknown}; known: {', '.join(sorted(OPPONENTS))}")
        if self.players < 2:
            raise ValueError(f"a league plays games of 2 or more players, not {self.players}")
        check_reset_probabilities(self.reset_after_snapshot)


class LeagueActor:
    def __init__(self, cfg: LeagueConfig, name: str = "league"):
        from openskill.models import PlackettLuce

        self.cfg, self.name = cfg, name
        self.roles = {m["id"]: m["role"] for m in cfg.members}
        self.mains = [m for m, role in self.roles.items() if role == "main"]
        self._rng = random.Random(cfg.seed)
        self._reset_rng = random.Random(cfg.seed + 1)  # resets draw apart: matchmaking's draws stay as they were
        self._model = PlackettLuce()
        self.path = Path(cfg.state_dir) / STATE_FILE
        self.snapshots: dict[str, dict] = {}  # id -> {"member", "version", "path"}
        self.payoff = Payoff(cfg.payoff_decay)
        self.ratings: dict[str, object] = {}
        self.history: list[dict] = []  # {"matches", "time", "ordinal": {player: ordinal}}
        self.evaluations: list[dict] = []
        self.versions = {m: 0 for m in self.roles}
        self.last_snapshot = {m: None for m in self.roles}  # member -> version of its last snapshot
        self._pending_snapshots: dict[str, bool] = {}  # member -> reset after its snapshot
        self.resets: list[dict] = []  # {"member", "snapshot", "version"}: reset to the base model after it
        self._stats = {"matches": 0, "requests": 0, "results": 0, "errored_matches": 0, "unrated_matches": 0,
                       "refused_snapshots": 0, "saves": 0}
        self._next_match = 0
        self._rejected = Rejections(f"{name}: match results")
        self.journal_path = Path(cfg.state_dir) / JOURNAL_FILE
        self._journal = None  # opened at the first result
        if cfg.resume:
            self._load()
        else:
            self.journal_path.unlink(missing_ok=True)

    # -- the loop ---------------------------------------------------------------------------------------

    async def run(self, transport, peers: dict, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with (
                # parts no larger than their kind's frames: a peer sending a larger one is cut off
                transport.open_receiver(capacity=256, max_message_bytes=FRAME_LIMITS[Kind.MATCH_REQUEST]) as requests,
                transport.open_receiver(capacity=256, max_message_bytes=FRAME_LIMITS[Kind.MATCH_RESULT]) as results,
                trio.open_nursery() as nursery,
            ):
                self._inboxes = {"requests": Inbox(requests, Kind.MATCH_REQUEST, MatchRequest.from_body),
                                 "results": Inbox(results, Kind.MATCH_RESULT, MatchResult.from_body)}
                nursery.start_soon(self._assign, transport)
                nursery.start_soon(self._take_results)
                nursery.start_soon(self._save_every)
                task_status.started({"requests": requests.address, "results": results.address})
        finally:
            self.save()
            if self._journal is not None:
                self._journal.close()

    async def _assign(self, transport) -> None:
        """Each assignment to its request's ``reply_to``, if the transport may connect there; a destination that
        takes nothing holds up only its own replies, dropped after a deadline (`streams.replies`, counted)."""
        async with open_replies(transport, Kind.MATCH, self.name) as replies:
            self._replies = replies
            while True:
                request = await self._inboxes["requests"].receive()
                self._stats["requests"] += 1
                replies.post(request.reply_to, self.assign(request).to_body())

    async def _take_results(self) -> None:
        while True:
            self.record(await self._inboxes["results"].receive())

    async def _save_every(self) -> None:
        while True:
            await trio.sleep(self.cfg.save_every_s)
            state = json.dumps(self.state())  # on the loop, between two results: it matches the journal's count
            await trio.to_thread.run_sync(self._write_state, state)

    # -- matches ----------------------------------------------------------------------------------------

    def assign(self, request: MatchRequest) -> MatchAssigned:
        """A match for one of the request's open members (admission lets a member in at its learner's pace),
        drawn at random; an unknown member in the request is left out, and logged."""
        open_members = [m for m in request.open_members if m in self.roles]
        if len(open_members) != len(request.open_members):
            log.warning("match request names members the league does not have: %s",
                        sorted(set(request.open_members) - set(self.roles)))
        learner = self._rng.choice(open_members or list(self.roles))
        role = self.roles[learner]
        owners = {s: info["member"] for s, info in self.snapshots.items()}

        def opponent():
            return choose_opponent(learner, role, self.mains, owners, self.payoff, self.cfg.matchmaking, self._rng)

        seats = seat_match(learner, opponent(), self.cfg.players, self._rng, choose_more=opponent)
        match = MatchAssigned(request.request_id, self._next_match, learner, seats)
        self._next_match += 1
        return match

    def record(self, result: MatchResult) -> bool:
        """Payoff and ratings after one match. The result goes to the journal first: a league restarted from its
        last saved state replays the results it took after it, so none is lost. A result that fails the check is
        neither journaled nor applied (False)."""
        if self._refused(result):
            return False
        if self._journal is None:
            self.journal_path.parent.mkdir(parents=True, exist_ok=True)
            self._journal = open(self.journal_path, "a")
        self._journal.write(json.dumps([result.match_id, result.learner, result.seats, result.returns,
                                        result.errored]) + "\n")
        self._journal.flush()  # in the OS's hands: a killed process loses none of it
        self._apply(result)
        return True

    def _refused(self, result: MatchResult) -> bool:
        """Does ``result`` fail the check? (Counted and logged if so.)"""
        reason, why = result_problem(result.learner, result.seats, result.returns, self.roles, self.cfg.players)
        if reason:
            self._rejected.add({reason: 1}, f"match {result.match_id}: {why}")
        return bool(reason)

    def _apply(self, result: MatchResult) -> None:
        self._stats["results"] += 1
        if result.errored:
            self._stats["errored_matches"] += 1
            return
        self._stats["matches"] += 1
        for opponent, score in pairwise_scores(result.seats, result.returns, result.learner):
            self.payoff.add(result.learner, opponent, score)
        self._rate(result.seats, result.returns)
        if self._stats["matches"] % self.cfg.history_every_matches == 0:
            self.history.append({"matches": self._stats["matches"], "time": time.time(),
                                 "ordinal": {p: r.ordinal() for p, r in self.ratings.items()}})

    def _rate(self, seats: list[str], returns: list[float]) -> None:
        """One OpenSkill update; a player in several seats is rated once, on its mean return there. A match of
        one player against itself says nothing about its rating."""
        players = list(dict.fromkeys(seats))
        if len(players) < 2:
            self._stats["unrated_matches"] += 1
            return
        scores = [sum(r for s, r in zip(seats, returns) if s == p) / seats.count(p) for p in players]
        teams = [[self.ratings.get(p) or self._model.rating(name=p)] for p in players]
        for player, [rating] in zip(players, self._model.rate(teams, scores=scores)):
            self.ratings[player] = rating

    # -- snapshots --------------------------------------------------------------------------------------

    def observe(self, versions: dict[str, int]) -> dict[str, bool]:
        """Take the members' learner versions; the members now due for a snapshot (each asked once), each with
        whether its learner is to reset it to the base model once the snapshot is written."""
        due = {}
        for member, version in versions.items():
            if member not in self.roles:
                raise ValueError(f"observe: {member!r} is not a member of this league")
            self.versions[member] = version
            if member in self._pending_snapshots or version == self.last_snapshot[member]:
                continue
            if snapshot_due(version, self.last_snapshot[member], self._win_rate_vs_snapshots(member),
                            every_versions=self.cfg.snapshot_every_versions,
                            min_versions=self.cfg.snapshot_min_versions,
                            win_rate_threshold=self.cfg.snapshot_win_rate):
                reset = reset_after_snapshot(self.roles[member], self.cfg.reset_after_snapshot, self._reset_rng)
                self._pending_snapshots[member] = due[member] = reset
        return due

    def _win_rate_vs_snapshots(self, member: str) -> float | None:
        met = [s for s in self.snapshots if self.payoff.games(member, s) >= 1]
        if not met:
            return None
        return sum(self.payoff.win_rate(member, s) for s in met) / len(met)

    def expect_snapshots(self, asked: dict[str, bool]) -> None:
        """Snapshots the driver asked for (member -> reset after it) that a predecessor of this league named due
        and did not see registered: a restarted league does not name them due again."""
        self._pending_snapshots.update(asked)

    def add_snapshot(self, snapshot: str, member: str, version: int, path: str) -> bool:
        """Register a snapshot the member's learner wrote; False (logged) if its checksums do not hold. A reset
        that followed it is recorded with it (the learner resets once the snapshot is on disk)."""
        if self._pending_snapshots.pop(member, False) and all(r["snapshot"] != snapshot for r in self.resets):
            self.resets.append({"member": member, "snapshot": snapshot, "version": version})
            log.info("%s starts again from the base model after its snapshot %s", member, snapshot)
        if snapshot in self.snapshots:
            return True
        try:
            verify_snapshot(path)
        except SnapshotError as error:
            self._stats["refused_snapshots"] += 1
            log.warning("snapshot %s refused: %s", snapshot, error)
            return False
        self.snapshots[snapshot] = {"member": member, "version": version, "path": str(path)}
        self.last_snapshot[member] = version
        log.info("snapshot %s joins the league (%d snapshots)", snapshot, len(self.snapshots))
        return True

    def record_evaluation(self, evaluation: dict) -> None:
        self.evaluations.append(evaluation)

    # -- state ------------------------------------------------------------------------------------------

    def table(self) -> dict:
        """Ratings (best first), the payoff matrix over every player, and the counts."""
        players = sorted(self.ratings, key=lambda p: -self.ratings[p].ordinal())
        players += [p for p in [*self.roles, *self.snapshots] if p not in players]
        return {"players": players,
                "ratings": {p: {"mu": r.mu, "sigma": r.sigma, "ordinal": r.ordinal()} for p, r in self.ratings.items()},
                "payoff": self.payoff.matrix(players), "snapshots": dict(self.snapshots),
                "members": dict(self.roles), "versions": dict(self.versions), "resets": list(self.resets),
                **self._stats}

    def state(self) -> dict:
        return {"members": self.cfg.members, "snapshots": self.snapshots, "payoff": self.payoff.to_json(),
                "ratings": {p: [r.mu, r.sigma] for p, r in self.ratings.items()}, "history": self.history,
                "evaluations": self.evaluations, "versions": self.versions, "last_snapshot": self.last_snapshot,
                "resets": self.resets,
                "next_match": self._next_match, "stats": self._stats, "saved_at": time.time()}

    def save(self) -> None:
        self._write_state(json.dumps(self.state()))

    def _write_state(self, state: str) -> None:
        """Write the state to a new file and rename it over the last: a kill leaves one or the other whole."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fresh = self.path.with_suffix(".json.new")
        fresh.write_text(state)
        os.replace(fresh, self.path)
        self._stats["saves"] += 1

    def _load(self) -> None:
        if not self.path.exists():
            raise FileNotFoundError(f"league resume: no {STATE_FILE} in {self.path.parent}")
        state = json.loads(self.path.read_text())
        saved = sorted(m["id"] for m in state["members"])
        if saved != sorted(self.roles):
            raise ValueError(f"league resume: the saved league has members {saved}, the config {sorted(self.roles)}")
        self.snapshots, self.history, self.evaluations = state["snapshots"], state["history"], state["evaluations"]
        self.payoff = Payoff.from_json(state["payoff"])
        self.ratings = {p: self._model.rating(mu=mu, sigma=sigma, name=p) for p, (mu, sigma) in state["ratings"].items()}
        self.versions.update(state["versions"])
        self.last_snapshot.update(state["last_snapshot"])
        self._next_match = state["next_match"]
        self.resets = state.get("resets", [])
        self._stats.update(state["stats"])
        replayed = self._replay_journal()
        log.info("league resumed: %d matches, %d snapshots, %d rated players (%d results replayed from the journal)",
                 self._stats["matches"], len(self.snapshots), len(self.ratings), replayed)

    def _replay_journal(self) -> int:
        """Apply the journaled results after the saved state's; a torn last line (a kill mid-write) is cut off."""
        if not self.journal_path.exists():
            return 0
        text = self.journal_path.read_text()
        complete = text[:text.rfind("\n") + 1]
        if complete != text:
            self.journal_path.write_text(complete)
        entries = [json.loads(line) for line in complete.splitlines()]
        pending = entries[self._stats["results"]:]
        for entry in pending:
            try:
                result = MatchResult(*entry)
            except TypeError:  # not the five fields of a result
                result = MatchResult(-1, "", [], [])
            if self._refused(result):  # journaled before results were checked: skipped, its place kept
                self._stats["results"] += 1
                continue
            self._apply(result)
        return len(pending)

    def statistics(self) -> LeagueStatistics:
        inboxes = getattr(self, "_inboxes", {})
        return {**self._stats, "snapshots": len(self.snapshots), "pending_snapshots": sorted(self._pending_snapshots),
                "rejected_results": self._rejected.total(), "rejected_by_reason": dict(self._rejected.counts),
                "resets": len(self.resets),
                "ratings": {p: r.ordinal() for p, r in self.ratings.items()},
                "dropped_frames": sum(i.statistics()["dropped_frames"] for i in inboxes.values()),
                "streams": {name: i.statistics() for name, i in inboxes.items()},
                "replies": self._replies.statistics() if getattr(self, "_replies", None) else {}}


def load_state(run_dir: str | Path) -> dict:
    """The league state a run wrote (``tidal league table``)."""
    path = Path(run_dir) / "league" / STATE_FILE
    if not path.exists():
        raise FileNotFoundError(f"{run_dir} holds no league state ({path} is missing): not a league run directory")
    return json.loads(path.read_text())
