"""One league run from start to summary: topology, snapshots, evaluations, metrics, the league table.

The driver is the control plane's part of a league: every ``log_every_s`` it reads every actor's statistics
(the health check too), hands the members' learner versions to the league (which names the members due for a
snapshot, and the exploiters to reset after theirs), asks those members' learners to write one (and reset), and
registers the snapshots they wrote with the league.
Every main agent plays evaluation games against each fixed opponent of ``eval.opponents`` at the start, every
``eval.every_s`` and at the end; their results go to ``metrics.jsonl`` and into the league state.

The health check restarts a dead actor (``run.restart=false``: any dead actor ends the run, with the command that
resumes it). A member's group (rollout, reward, replay, learner) and the env actors come back as in a
single-policy run (``actors/runs/recovery.py``); a learner that died with a snapshot asked of it is asked again. The
league comes back from its state on disk (saved every ``league.args.save_every_s``) and replays the match results
it journaled after it (``league_results_lost`` in the summary counts any the restart did not bring back); the
snapshots and evaluations the driver registered since are registered again, and every env actor sends again the
match request it may have been waiting on.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import datetime
from pathlib import Path

from actors.engines.base_model import ensure_base_model, tiny_model_config
from actors.runs.monitor import ContinuedCounters, Evaluation
from actors.league import load_state
from actors.runs.recovery import GroupRecovery, call_unless_dead, restart_env, statistics_or_recover

log = logging.getLogger(__name__)


class LeagueRun:
    def __init__(self, cfg: dict):
        self.cfg = cfg
        run = cfg["run"]
        self.dir = Path(run["dir"]).expanduser() / (run["name"] or datetime.now().strftime("league-%Y%m%d-%H%M%S"))
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "config.json").write_text(json.dumps(cfg, indent=2))
        self.mains = [m["id"] for m in cfg["league"]["members"] if m["role"] == "main"]
        self.registered: set[str] = set()
        self.asked: dict[str, bool] = {}  # member -> reset: snapshots asked for and not registered yet
        self.restarts: dict[str, int] = {}  # actor -> times restarted after it died
        self.evaluations: list[dict] = []
        self.open_evaluations: list[Evaluation] = []  # under way: a restarted env actor plays its share again
        self.training = False
        self.league_matches = 0  # rated matches in the league's last statistics
        self.league_results_lost = 0  # taken by a league that died before it saved them
        self.counters = ContinuedCounters()  # env actors' counters in the metrics go on over their restarts
        self.started = None

    def model_path(self) -> Path:
        model = self.cfg["model"]
        if model["path"]:
            return Path(model["path"]).expanduser()
        return ensure_base_model(model["cache_dir"], tiny_model_config(self.cfg))

    def execute(self) -> dict:
        from actors.launcher import build_league_topology, open_cluster

        model_path = self.model_path()
        cluster = open_cluster(self.cfg)
        interrupted = False
        try:
            self.cluster = cluster
            self.top = build_league_topology(cluster, self.cfg, model_path, self.dir)
            self.groups = {m: GroupRecovery(cluster, mtop, self.top.envs, self.dir / "members" / m / "policy")
                           for m, mtop in self.top.members.items()}
            self._evaluate("resume" if self.cfg.get("resume") else "start", self.cfg["eval"]["endpoint_games_per_seat"])
            self.started = time.time()
            self._set_training(True)
            self._train()
            self._set_training(False)
            self._evaluate("final", self.cfg["eval"]["endpoint_games_per_seat"])
        except KeyboardInterrupt:
            interrupted = True
            log.warning("interrupted: stopping the league and writing what it measured")
        finally:
            table = self._table_or_none() if hasattr(self, "top") else None
            cluster.shutdown()  # the league writes its state as it stops
        return self._summarize(table, interrupted)

    def _stats(self) -> dict[str, dict]:
        """Every actor's statistics; this is also the health check: a dead actor is found here."""
        return statistics_or_recover(self.cluster, self.top.names(), self._recover)

    def _set_training(self, on: bool) -> None:
        self.training = on
        for env in self.top.envs:
            self.cluster.call(env, "set_training", on)

    def _recover(self, name: str, error: Exception) -> dict:
        """Restart a dead actor (README, "Self-play leagues"); with ``run.restart=false``, end the run, saying how
        to resume it."""
        if not self.cfg["run"].get("restart", True):
            raise RuntimeError(f"the {name} actor died ({type(error).__name__}) and run.restart is off: continue "
                               f"the league with `tidal league run resume={self.dir}`") from error
        log.warning("%s died (%s); restarting it", name, type(error).__name__)
        incarnation = self.restarts[name] = self.restarts.get(name, 0) + 1
        if name == self.top.league:
            self._restart_league()
        elif name in self.top.envs:
            self.counters.restarted(name)
            restart_env(self.cluster, name, incarnation, {m: top.replay for m, top in self.top.members.items()},
                        self.training, self.open_evaluations)
        else:
            member = next(m for m, group in self.groups.items() if group.owns(name))
            self.groups[member].restart(name)
            if name == self.top.members[member].learner and member in self.asked:  # its snapshot died with it
                self._ask_snapshot(member, self.asked[member])
        return self.cluster.statistics(name)

    def _restart_league(self) -> None:
        """From its last saved state (a fresh league if it died before its first save)."""
        try:
            saved = load_state(self.dir)
        except FileNotFoundError:
            saved = None
        self.cluster.restart(self.top.league, resume=saved is not None)
        kept = self.cluster.statistics(self.top.league)["matches"]  # its saved state and its journal's results
        self.league_results_lost += max(self.league_matches - kept, 0)
        log.warning("the league restarted with %d rated matches (%d before it died)", kept, self.league_matches)
        self.league_matches = kept
        self.registered = set(saved["snapshots"]) if saved else set()  # the next tick registers the others again
        self.cluster.call(self.top.league, "expect_snapshots", self.asked)
        recorded = {e["tag"] for e in saved["evaluations"]} if saved else set()
        for evaluation in self.evaluations:
            if evaluation["tag"] not in recorded:
                self.cluster.call(self.top.league, "record_evaluation", evaluation)
        for env in self.top.envs:
            call_unless_dead(self.cluster, env, "reissue_match_request")

    def _tick(self) -> dict:
        """Versions to the league, snapshots it wants to the learners, written snapshots to the league."""
        stats = self._stats()
        self.league_matches = stats[self.top.league]["matches"]
        learners = {m: stats[top.learner] for m, top in self.top.members.items()}
        for member, learner in learners.items():
            for snapshot in learner["snapshots"]:
                if snapshot["id"] not in self.registered:
                    if self._call_league("add_snapshot", snapshot["id"], member, snapshot["version"],
                                         snapshot["path"]) is None:
                        return stats  # the league died since the health check: the next one restarts it
                    self.registered.add(snapshot["id"])
                    self.asked.pop(member, None)
        due = self._call_league("observe", {m: s["version"] for m, s in learners.items()}) or {}
        for member, reset in due.items():
            self.asked[member] = reset
            self._ask_snapshot(member, reset)
        return stats

    def _ask_snapshot(self, member: str, reset: bool) -> None:
        """Ask ``member``'s learner for a snapshot (and, with ``reset``, to start again from the base model); a
        learner that died meanwhile is asked again by its restart."""
        call_unless_dead(self.cluster, self.top.members[member].learner, "snapshot",
                         str(self.dir / "league" / "snapshots"), reset)

    def _call_league(self, method: str, *args):
        """Call the league; None if it died since the last health check (the next one restarts it, and the
        restart registers again what it had not saved)."""
        return call_unless_dead(self.cluster, self.top.league, method, *args)

    def _train(self) -> None:
        run, ev = self.cfg["run"], self.cfg["eval"]
        budget, next_eval, rounds = run["minutes"] * 60, time.time() + (ev["every_s"] or float("inf")), 0
        while time.time() - self.started < budget:
            time.sleep(min(run["log_every_s"], max(budget - (time.time() - self.started), 0.05)))
            stats = self._tick()
            self._write_metrics(stats)
            if time.time() >= next_eval:
                rounds += 1
                self._evaluate(f"during-{rounds}", ev["games_per_seat"])
                next_eval = time.time() + ev["every_s"]
            if run["max_matches"] and stats[self.top.league]["matches"] >= run["max_matches"]:
                break

    def _evaluate(self, tag: str, games: int) -> None:
        """Every main agent against every fixed opponent of ``eval.opponents``, one round after another."""
        for main in self.mains:
            for opponent in self.cfg["eval"]["opponents"]:
                evaluation = Evaluation(self.cluster, self.top.envs, f"{tag}-{main}-{opponent}", games, opponent, main)
                self.open_evaluations.append(evaluation)
                while (result := evaluation.result(self._tick())) is None:
                    time.sleep(0.2)
                self.open_evaluations.remove(evaluation)
                result["minute"] = (time.time() - self.started) / 60 if self.started else 0.0
                self.evaluations.append(result)
                self._call_league("record_evaluation", result)
                self._write_metrics(self._stats(), evaluation=result)
                log.info("evaluation %s: %s wins %.3f against %s", result["tag"], main, result["win_rate"], opponent)

    def _write_metrics(self, stats: dict, evaluation: dict | None = None) -> None:
        league = stats[self.top.league]
        envs = [s for name, s in self.counters.apply(stats).items() if name in self.top.envs]
        row = {"time": time.time(), "elapsed_s": time.time() - self.started if self.started else 0.0,
               "matches": league["matches"], "snapshots": league["snapshots"], "ratings": league["ratings"],
               "versions": {m: stats[top.learner]["version"] for m, top in self.top.members.items()},
               "episodes": sum(s["episodes"] for s in envs), "invalid_actions": sum(s["invalid_actions"] for s in envs),
               "turns": sum(s["turns"] for s in envs),
               "dropped_frames": sum(s.get("dropped_frames", 0) for s in stats.values()),
               "restarts": sum(self.restarts.values())}
        if evaluation is not None:
            row["evaluation"] = evaluation
        with (self.dir / "metrics.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")

    def _table_or_none(self) -> dict | None:
        try:
            return self.cluster.call(self.top.league, "table")
        except Exception as error:  # the league died: the summary says so, its last saved state stays on disk
            log.warning("no league table at the end: %s", error)
            return None

    def _summarize(self, table: dict | None, interrupted: bool) -> dict:
        summary = {"run_dir": str(self.dir), "interrupted": interrupted,
                   "minutes": (time.time() - self.started) / 60 if self.started else 0.0,
                   "table": table, "evaluations": self.evaluations, "restarts": self.restarts,
                   "league_results_lost": self.league_results_lost}
        (self.dir / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary
