"""One training run from start to summary: base model, topology, evaluations, metrics, plot."""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

from actors.runs.autoscale import AutoscaleConfig, autoscale_target
from actors.engines.base_model import ensure_base_model, tiny_model_config
from actors.runs.control import ControlServer
from actors.admission import admission_share
from actors.runs.monitor import Evaluation, MetricsLog, plot_learning_curve
from actors.runs.recovery import GroupRecovery, call_unless_dead, restart_env, statistics_or_recover

log = logging.getLogger(__name__)
SCALABLE = ("rollout", "env")
DRAIN_TIMEOUT_S = 300.0  # how long leaving env actors may take to finish their episodes in flight


class Run:
    def __init__(self, cfg: dict):
        self.cfg = cfg
        run = cfg["run"]
        name = run["name"] or datetime.now().strftime("%Y%m%d-%H%M%S")
        self.dir = Path(run["dir"]).expanduser() / name
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "config.json").write_text(json.dumps(cfg, indent=2))
        self.metrics = MetricsLog(self.dir, window_s=run.get("return_window_s", 30.0),
                                  window_episodes=run.get("return_window_episodes") or 0)
        self.resumed = bool(cfg.get("resume"))
        # A resumed run continues its clock and its curves: its budget is the run's, not one more of it.
        self.offset_s = self.metrics.load() if self.resumed else 0.0
        self.evaluations: list[dict] = [r["evaluation"] for r in self.metrics.rows if "evaluation" in r]
        self.started = None
        self.target_reached_s = None
        self.training_end: dict | None = None  # the last metrics row of training, before the final evaluation
        self.restarts: dict[str, int] = {}  # actor -> times restarted after it died
        self.training = False  # env actors may start training episodes (a restarted one is told again)
        self.open_evaluations: list[Evaluation] = []  # under way: a restarted env actor plays its share again
        self.scale_requests: queue.Queue = queue.Queue()  # (kind, count), from any thread: see ``scale``
        self.scale_events: list[dict] = []
        self._rollouts_made = 0  # rollout actors ever started: a joining one gets a name never used
        self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tidal-scale")
        self._joining: Future | None = None  # actors starting for the scale to ``_target``
        self._target: tuple[str, int] = ("", 0)  # (kind, count) of the scale under way
        self._deferred: tuple[str, int] | None = None  # an env scale-down waiting for an evaluation to end
        self._retiring: dict[str, int] = {}  # leaving env actors -> their restarts when told to retire
        self._retire_deadline = 0.0
        self._envs_made = 0  # env actors ever started, as for rollout actors
        self.autoscale = AutoscaleConfig(**cfg["rollout"].get("autoscale", {}))
        if self.autoscale.enabled and run["mode"] != "ray":
            raise ValueError("rollout.autoscale.enabled needs run.mode=ray (in one process no actor can leave)")
        self._autoscale_history: list[tuple[int, float]] = []
        self._stop = threading.Event()  # ``stop``: end training at the next round, as the budget would

    def scale(self, kind: str, count: int) -> int:
        """Ask for ``count`` actors of ``kind`` (rollout or env); applied by the run's loop at its next round.
        Returns how many it runs now. Any thread may call it (the control endpoint's does)."""
        if kind not in SCALABLE:
            raise ValueError(f"cannot scale {kind!r} actors: only {', '.join(SCALABLE)} actors can be scaled")
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ValueError(f"scale {kind}={count!r}: the count must be an integer >= 1")
        if self.cfg["run"]["mode"] != "ray":
            raise ValueError("scaling needs run.mode=ray (in one process no actor can leave)")
        self.scale_requests.put((kind, count))
        return len(self._scaled(kind)) if hasattr(self, "top") else 0

    def stop(self) -> None:
        """End training at the run's next round, then evaluate and summarize as at the end of its budget. Any
        thread may call it."""
        self._stop.set()

    def _scaled(self, kind: str) -> list[str]:
        return self.top.rollouts if kind == "rollout" else self.top.envs

    def model_path(self) -> Path:
        model = self.cfg["model"]
        if model["path"]:
            path = Path(model["path"]).expanduser()
            if not (path / "config.json").exists():
                raise FileNotFoundError(f"model.path={path} is not a Hugging Face model directory (no config.json)")
            return path
        return ensure_base_model(model["cache_dir"], tiny_model_config(self.cfg))

    def execute(self) -> dict:
        from actors.launcher import build_topology, open_cluster

        model_path = self._model_path = self.model_path()
        cluster = open_cluster(self.cfg)
        interrupted, control = False, None
        try:
            self.top = build_topology(cluster, self.cfg, model_path, self.dir)
            self.cluster = cluster
            self.group = GroupRecovery(cluster, self.top, self.top.envs, self.dir / "policy")
            if self.cfg["run"]["mode"] == "ray":  # `tidal scale` reaches the run here
                control = ControlServer(self.dir, self.scale)
            self._evaluate_now("resume" if self.resumed else "start", self.cfg["eval"]["endpoint_games_per_seat"])
            # minute 0 of the curves: training starts (a resumed run goes on from where its metrics stopped)
            self.started = self.metrics.started = time.time() - self.offset_s
            self._set_training(True)
            self._train()
            self.training_end = self.metrics.rows[-1] if self.metrics.rows else None
            self._set_training(False)
            self._evaluate_now("final", self.cfg["eval"]["endpoint_games_per_seat"])
        except KeyboardInterrupt:
            interrupted = True
            log.warning("interrupted: stopping the run and writing what it measured")
        finally:
            if control is not None:
                control.close()
            self._spawner.shutdown(wait=True)
            cluster.shutdown()
        return self._summarize(interrupted)

    def _stats(self) -> dict[str, dict]:
        """Every actor's statistics; this is also the health check: a dead actor is found here."""
        return statistics_or_recover(self.cluster, self.top.names(), self._recover)

    def _recover(self, name: str, error: Exception) -> dict:
        """Restart a dead actor of any kind, losing nothing and counting nothing twice (README, "Faults")."""
        if not self.cfg["run"].get("restart", True):
            raise RuntimeError(f"the {name} actor died ({type(error).__name__}) and run.restart is off: continue "
                               f"the run with `tidal launch resume={self.dir}`") from error
        log.warning("%s died (%s); restarting it", name, type(error).__name__)
        if name in self.top.envs:
            restart_env(self.cluster, name, self.restarts.get(name, 0) + 1,
                        {self.cfg["env"]["args"]["policy_id"]: self.top.replay}, self.training, self.open_evaluations)
        else:  # rollout, reward, replay, learner: as in every policy's group (actors/runs/recovery.py)
            self.group.restart(name)
        self.restarts[name] = self.restarts.get(name, 0) + 1
        self.metrics.restarted(name)
        return self.cluster.statistics(name)

    def _call_unless_dead(self, name: str, method: str, *args):
        return call_unless_dead(self.cluster, name, method, *args)

    def _set_training(self, on: bool) -> None:
        self.training = on
        for env in self.top.envs:  # one found dead is told by its restart
            self._call_unless_dead(env, "set_training", on)

    def _evaluation(self, tag: str, games: int) -> Evaluation:
        self.open_evaluations.append(Evaluation(self.cluster, self.top.envs, tag, games, self.cfg["eval"]["opponent"]))
        return self.open_evaluations[-1]

    def _result(self, evaluation: Evaluation, stats: dict) -> dict | None:
        result = evaluation.result(stats)
        if result is not None:
            self.open_evaluations.remove(evaluation)
        return result

    def _apply_scaling(self) -> None:
        """Carry out the scale requests, one at a time. Joining actors start in a thread (loading a model takes
        seconds): the run's loop goes on meanwhile, and connects them once they are up. Env actors leave only
        between evaluations (each plays its share of one)."""
        if self._retiring:
            if not self._retired():
                return
            self._set_count(*self._target, [])
        if self._joining is not None:
            if not self._joining.done():
                return
            joined = self._joining.result()  # raises what a failed start raised
            self._joining = None
            self._set_count(*self._target, joined)
        while self._joining is None and not self._retiring and (self._deferred or not self.scale_requests.empty()):
            kind, count = self._deferred or self.scale_requests.get()
            before = len(self._scaled(kind))
            if kind == "env" and count < before and self.open_evaluations:
                self._deferred = (kind, count)
                return
            self._deferred, self._target = None, (kind, count)
            self.scale_events.append({"time": time.time(), "kind": kind, "from": before, "to": count})
            log.warning("scaling %s actors from %d to %d", kind, before, count)
            if count > before:
                start = self._start_rollouts if kind == "rollout" else self._start_envs
                self._joining = self._spawner.submit(start, count - before)
            elif kind == "env" and count < before:  # the leaving ones first deliver what they started
                self._retiring = dict.fromkeys(self.top.envs[count:], -1)
                self._retire_deadline = time.monotonic() + DRAIN_TIMEOUT_S
                self._retired()
            else:
                self._set_count(kind, count, [])

    def _set_count(self, kind: str, count: int, joined: list[str]) -> None:
        if kind == "rollout":
            self._set_rollouts(count)
        else:
            self._set_envs(count, joined)
        log.warning("%d %s actors serve the run", count, kind)
        self.scale_events[-1]["applied"] = time.time()  # from now on ``count`` actors serve

    def _autoscale(self, row: dict) -> None:
        """With ``rollout.autoscale.enabled``: one step towards the rollout actors the queue asks for."""
        if not self.autoscale.enabled or self._joining is not None or not self.scale_requests.empty():
            return
        self._autoscale_history.append((row.get("queue_requests", 0), row.get("rollout_idle", 0.0)))
        actors = len(self.top.rollouts)
        target = autoscale_target(self.autoscale, actors, self._autoscale_history)
        if target != actors:
            log.warning("autoscale: %d rollout actors -> %d (requests waiting, idle: %s)", actors, target,
                        self._autoscale_history[-self.autoscale.patience:])
            self.scale("rollout", target)
            self._autoscale_history = []

    def _start_rollouts(self, joining: int) -> list[str]:
        from actors.launcher import spawn_rollouts

        made = max(self._rollouts_made, len(self.top.rollouts))
        self._rollouts_made = made + joining
        spawn_rollouts(self.cluster, self.cfg, self._model_path, self.top, range(made, self._rollouts_made))
        return []

    def _start_envs(self, joining: int) -> list[str]:
        """Env actors with names never used, not training yet: ``_set_envs`` gives them their shares."""
        from actors.launcher import spawn_envs

        made = max(self._envs_made, len(self.top.envs))
        self._envs_made = made + joining
        return spawn_envs(self.cluster, self.cfg, self._model_path, self.top,
                          [(f"env-{i}", i, (0, 1)) for i in range(made, self._envs_made)])

    def _set_envs(self, count: int, joined: list[str]) -> None:
        """Env actors: the ``joined`` ones come in, or the last ones (retired, see ``_retired``) go. Then the
        admission allowance is shared again among the ``count`` that stay (README, "Faults and scaling"): with
        training paused, the episodes counted as started by all of them, the leaving ones included, are spread
        over the new shares, each actor's count moving by the difference, so the counts still add up to the
        run's total and the staleness bound holds exactly."""
        top = self.top
        top.envs.extend(joined)  # in place: GroupRecovery holds this list
        keep, leaving = top.envs[:count], top.envs[count:]
        training, self.training = self.training, False  # an actor restarted meanwhile waits too
        for name in keep:
            self._call_unless_dead(name, "set_training", False)
        stats = statistics_or_recover(self.cluster, top.envs, self._recover)
        total = sum(s["started"] for s in stats.values())
        for i, name in enumerate(keep):
            delta = admission_share(total, i, count) - stats[name]["started"]
            # a restart of it from now on counts what ``rebalance`` makes its count (offset + delivered)
            self.cluster.reconfigure(name, admission_slot=(i, count),
                                     admission_offset=stats[name]["admission_offset"] + delta)
            self._call_unless_dead(name, "rebalance", (i, count), delta)
        for name in leaving:
            self.cluster.stop(name)
            self.metrics.retired(name)
        top.envs[:] = keep
        self._retiring = {}
        self._set_training(training)

    def _retired(self) -> bool:
        """Whether every leaving env actor has delivered (or given back) each episode it started, after it was
        told to ``retire``; one restarted since is told again. The run's loop goes on meanwhile (health checks,
        metrics), only no evaluation starts."""
        for name, told in self._retiring.items():
            if told != self.restarts.get(name, 0):
                self._call_unless_dead(name, "retire")
                self._retiring[name] = self.restarts.get(name, 0)
        stats = statistics_or_recover(self.cluster, list(self._retiring), self._recover)
        if all(s["drained"] for s in stats.values()):
            return True
        if time.monotonic() > self._retire_deadline:
            raise TimeoutError(f"the leaving env actors {list(self._retiring)} did not finish their episodes in "
                               f"flight within {DRAIN_TIMEOUT_S:.0f} s")
        return False

    def _set_rollouts(self, count: int) -> None:
        """Env actors send to the first ``count`` rollout actors (joining ones take the latest weights, which
        the learner announces every second); the others go: once they are gone, env actors send again what they
        left unanswered (an answer that still comes is counted once)."""
        top = self.top
        leaving, top.rollouts = top.rollouts[count:], top.rollouts[:count]
        addresses = [top.requests[name] for name in top.rollouts]
        for env in top.envs:
            self.cluster.set_peers(env, "rollout", addresses)  # first: a restart connects to these
            self._call_unless_dead(env, "set_rollouts", addresses)
        for name in leaving:
            self.cluster.stop(name)
            top.requests.pop(name)
            self.metrics.retired(name)
        if leaving:
            reissued = sum(self._call_unless_dead(env, "reissue") or 0 for env in top.envs)
            log.warning("%d unanswered generation requests of the leaving rollout actors sent again", reissued)

    def _evaluate_now(self, tag: str, games: int) -> dict:
        evaluation = self._evaluation(tag, games)
        while (result := self._result(evaluation, self._stats())) is None:
            time.sleep(0.5)
        return self._record(result)

    def _record(self, result: dict, stats: dict | None = None) -> dict:
        result["minute"] = (time.time() - self.started) / 60 if self.started else self.offset_s / 60
        self.evaluations.append(result)
        self.metrics.snapshot(stats or self._stats(), evaluation=result)
        log.info("evaluation %s: non-loss %.3f vs %s (by seat %s), invalid %.3f", result["tag"], result["nonloss"],
                 result["opponent"], {k: round(v, 3) for k, v in result["nonloss_by_seat"].items()},
                 result["invalid_rate"])
        return result

    def _train(self) -> None:
        from tqdm import tqdm

        run, ev = self.cfg["run"], self.cfg["eval"]
        budget = run["minutes"] * 60
        bar = tqdm(total=round(budget), unit="s", disable=not run["progress"], dynamic_ncols=True)
        # a resumed run numbers its evaluations on from its first life's
        rounds = sum(e["tag"].startswith("during-") for e in self.evaluations)
        pending, next_eval = None, time.time() + ev["every_s"]  # (a resumed run just evaluated, as "resume")
        while (elapsed := time.time() - self.started) < budget and not self._stop.is_set():
            time.sleep(min(run["log_every_s"], max(budget - elapsed, 0.05)))
            self._apply_scaling()
            stats = self._stats()
            if pending is not None and (result := self._result(pending, stats)) is not None:
                self._record(result, stats)  # writes this round's metrics row too
                pending = None
            else:
                self.metrics.snapshot(stats)
            row = self.metrics.rows[-1]
            self._autoscale(row)
            if pending is None and ev["every_s"] and time.time() >= next_eval and not self._retiring:
                rounds += 1
                pending = self._evaluation(f"during-{rounds}", ev["games_per_seat"])
                next_eval = time.time() + ev["every_s"]
            bar.update(min(round(time.time() - self.started), bar.total) - bar.n)
            bar.set_postfix(self._postfix(row), refresh=True)
            if run["max_versions"] and row["version"] >= run["max_versions"]:
                break
            target, reward = run.get("target_return"), row.get("train_return")
            if target is not None and reward is not None and reward >= target:
                self.target_reached_s = time.time() - self.started
                log.info("training return %.3f reached the target %.3f after %.1f s", reward, target,
                         self.target_reached_s)
                break
        bar.close()

    def _postfix(self, row: dict) -> dict:
        last = self.evaluations[-1]["nonloss"] if self.evaluations else None
        return {"v": row["version"], "eps/s": f"{row.get('episodes_per_s', 0):.0f}",
                "tok/s": f"{row.get('tokens_per_s', 0):.0f}",
                "stale": f"{row.get('staleness_mean', 0):.1f}", "nonloss": f"{last:.2f}" if last is not None else "-"}

    def _summarize(self, interrupted: bool) -> dict:
        rows = self.metrics.rows
        by_tag = {e["tag"]: e for e in self.evaluations}
        start, final = by_tag.get("start"), by_tag.get("final")
        rates = [r["episodes_per_s"] for r in rows if r.get("episodes_per_s")]
        trained = self.training_end or (rows[-1] if rows else {})  # busy and idle while training, not evaluating
        summary = {
            "run_dir": str(self.dir),
            "interrupted": interrupted,
            "minutes": (time.time() - self.started) / 60 if self.started else 0.0,
            "start_nonloss": start["nonloss"] if start else None,
            "final_nonloss": final["nonloss"] if final else None,
            "final_version": rows[-1]["version"] if rows else 0,
            "episodes": rows[-1]["episodes"] if rows else 0,
            "episodes_per_s": sum(rates) / len(rates) if rates else None,
            "train_return": next((r["train_return"] for r in reversed(rows) if r.get("train_return") is not None), None),
            "target_reached_s": self.target_reached_s,
            "learner_busy": trained.get("learner_busy"),
            "rollout_idle": trained.get("rollout_idle"),
            "staleness_hist": rows[-1].get("staleness_total") if rows else {},
            "rejected_episodes": rows[-1].get("rejected_episodes") if rows else 0,
            "rejected_turns": rows[-1].get("rejected_turns", 0) if rows else 0,
            "restarts": self.restarts,
            "scale_events": self.scale_events,
            "life": self.top.life if hasattr(self, "top") else None,
            "evaluations": self.evaluations,
        }
        (self.dir / "summary.json").write_text(json.dumps(summary, indent=2))
        if self.evaluations:
            plot_learning_curve(self.evaluations, rows, self.dir / "learning_curve.png", self.cfg["eval"]["opponent"])
        return summary
