"""The league's part of the driver: a run holds one only when a league is configured.

Each round (every ``run.log_every_s``) the driver hands the steward every actor's statistics: it registers the
snapshots the members' learners wrote with the league, hands the league the learners' versions (it names the
members due for a snapshot, and the exploiters to reset after theirs), and asks those members' learners to write
one (and reset). Evaluation results are recorded in the league's state too.

A dead league comes back from its state on disk (saved every ``league.args.save_every_s``) and replays the match
results it journaled after it (``league_results_lost`` in the summary counts any the restart did not bring
back); the snapshots and evaluations registered since are registered again, and every env actor sends again the
match request it may have been waiting on. A learner that died with a snapshot asked of it is asked again.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from actors.env.face import EnvFace
from actors.league.actor import load_state
from actors.league.face import LeagueFace, LeagueStatistics
from actors.learner.face import LearnerFace, LearnerStatistics
from actors.runs.handles import call_unless_dead, handle
from actors.runs.topology import Topology

log = logging.getLogger(__name__)


class LeagueSteward:
    def __init__(self, cluster, top: Topology, run_dir: Path, evaluations: list[dict]):
        """``evaluations``: the run's evaluation results (``Evaluations.results``), recorded with the league as
        they come (``record_evaluation``) and again after its restart."""
        self.cluster, self.top, self.dir, self.evaluations = cluster, top, run_dir, evaluations
        # a call that finds it dead since the health check is skipped (``call_unless_dead``): the next check
        # restarts it, and the restart registers again what it had not saved
        self.league = handle(cluster, top.league, LeagueFace)
        self.registered: set[str] = set()
        self.asked: dict[str, bool] = {}  # member -> reset: snapshots asked for and not registered yet
        self.matches = 0  # rated matches in the league's last statistics
        self.results_lost = 0  # taken by a league that died before it saved them

    def tick(self, stats: dict[str, Any]) -> None:
        """Versions to the league, snapshots it wants to the learners, written snapshots to the league."""
        league: LeagueStatistics = stats[self.top.league]
        self.matches = league["matches"]
        learners: dict[str, LearnerStatistics] = {m: stats[group.learner] for m, group in self.top.groups.items()}
        for member, learner in learners.items():
            for snapshot in learner["snapshots"]:
                if snapshot["id"] not in self.registered:
                    if call_unless_dead(self.league.add_snapshot, snapshot["id"], member, snapshot["version"],
                                        snapshot["path"]) is None:
                        return  # the league died since the health check: the next one restarts it
                    self.registered.add(snapshot["id"])
                    self.asked.pop(member, None)
        due = call_unless_dead(self.league.observe, {m: s["version"] for m, s in learners.items()}) or {}
        for member, reset in due.items():
            self.asked[member] = reset
            self._ask_snapshot(member, reset)

    def metrics(self, stats: dict[str, Any]) -> dict:
        """The league's fields of a metrics row."""
        league: LeagueStatistics = stats[self.top.league]
        learners: dict[str, LearnerStatistics] = {m: stats[group.learner] for m, group in self.top.groups.items()}
        return {"matches": league["matches"], "snapshots": league["snapshots"], "ratings": league["ratings"],
                "versions": {m: learner["version"] for m, learner in learners.items()}}

    def record_evaluation(self, result: dict) -> None:
        call_unless_dead(self.league.record_evaluation, result)

    def restart_league(self) -> None:
        """From its last saved state (a fresh league if it died before its first save)."""
        try:
            saved = load_state(self.dir)
        except FileNotFoundError:
            saved = None
        self.cluster.restart(self.top.league, resume=saved is not None)
        kept = self.league.statistics()["matches"]  # its saved state and its journal's results
        self.results_lost += max(self.matches - kept, 0)
        log.warning("the league restarted with %d rated matches (%d before it died)", kept, self.matches)
        self.matches = kept
        self.registered = set(saved["snapshots"]) if saved else set()  # the next tick registers the others again
        self.league.expect_snapshots(self.asked)
        recorded = {e["tag"] for e in saved["evaluations"]} if saved else set()
        for evaluation in self.evaluations:
            if evaluation["tag"] not in recorded:
                self.league.record_evaluation(evaluation)
        for env in self.top.envs:
            call_unless_dead(handle(self.cluster, env, EnvFace).reissue_match_request)

    def learner_restarted(self, member: str) -> None:
        """Its snapshot, if one was asked of it, died with it: ask again."""
        if member in self.asked:
            self._ask_snapshot(member, self.asked[member])

    def table_or_none(self) -> dict | None:
        try:
            return self.league.table()
        except Exception as error:  # the league died: the summary says so, its last saved state stays on disk
            log.warning("no league table at the end: %s", error)
            return None

    def _ask_snapshot(self, member: str, reset: bool) -> None:
        """Ask ``member``'s learner for a snapshot (and, with ``reset``, to start again from the base model); a
        learner that died meanwhile is asked again by its restart."""
        learner = handle(self.cluster, self.top.groups[member].learner, LearnerFace)
        call_unless_dead(learner.snapshot, self.top.snapshots, reset)
