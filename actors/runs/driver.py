"""One run from start to summary, for a single policy or a league: base model, topology, health checks and
restarts, scaling, evaluations, metrics, progress and the summary.

A single-policy run is a population of one member without a league; a league run holds a ``LeagueSteward``
besides. Both get the same restart policy, metrics writer, evaluation schedule and scaling.

Every ``run.log_every_s`` the driver reads every actor's statistics (the health check: a dead actor is found
and restarted here, losing nothing and counting nothing twice, see ``recovery.py``), lets the league's steward
do its round, writes a metrics row, collects finished evaluations and starts the next when due, and carries out
scale requests. ``run.restart=false``: any dead actor ends the run, with the command that resumes it; so does one
that died more than ``run.max_restarts`` times within ``run.restart_window_s`` (restarts of one actor are spaced
out by ``run.restart_backoff_s``, doubling). An actor that found its disk full (``host.DiskFull``) ends the run
at once, naming the directory, the space free there and the space the run needs: no restart would fix it. The
space is checked at start too (a warning: what a run needs beyond its checkpoints depends on how long it runs).

The driver holds the run directory's lock (``run_lock.py``) from its start to its summary: a second driver
(a resume of a running run) is refused. ``tidal scale`` and ``tidal stop`` reach a running run through its
control endpoint (``control.py``). At launch
and at its end the driver sweeps the shared-memory directories of this user's processes that died (a killed
learner's or rollout's weights: ``streams/private_files.py``).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import shutil
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from actors.env.face import EnvFace
from actors.runs.config import RunConfig, outside_settings, override, sampling_stops
from actors.models.chat import chat_problems
from actors.models.base_model import ensure_base_model, tiny_model_config
from actors.models.random_model import ensure_random_model, random_model_config
from actors.runs.ray_cluster import open_cluster
from actors.runs.control import ControlServer
from actors.runs.evaluations import Evaluations
from actors.runs.handles import call_unless_dead, handle
from actors.runs.host import full_disk_error
from actors.runs.inherited import count_inherited, release_inherited
from actors.runs.league_steward import LeagueSteward
from actors.observe.monitor import MetricsLog, plot_learning_curve
from actors.runs.run_lock import RunLock
from actors.runs.recovery import GroupRecovery, RestartLimit, RestartsExhausted, restart_env, statistics_or_recover
from actors.runs.scaling import ScaleContext, Scaler
from actors.observe.tensorboard import TensorBoardLog
from actors.observe.wandb_log import WandbLog
from actors.runs.topology import Topology, build_topology
from actors.rollout.actor import stop_problems_with
from streams.private_files import SHM_DIR, sweep_stale

log = logging.getLogger(__name__)
POLL_S = 0.5  # how often an endpoint evaluation's results are looked for
CHECKPOINT_COPIES = 2  # a learner's checkpoints on disk at once: the last one, and the one written to replace it


def run_directory(root: Path, name: str, resumed: bool) -> Path:
    """The run's directory, made: ``root/name``; where another run already lives there (its ``config.json``) and
    this is not its resume, a fresh ``root/name-2`` (-3, ...) instead, said in the log: a run never appends to
    another's metrics."""
    path = root / name
    if resumed:
        path.mkdir(parents=True, exist_ok=True)
        return path
    root.mkdir(parents=True, exist_ok=True)
    for k in itertools.count(1):
        candidate = path if k == 1 else root / f"{name}-{k}"
        try:
            candidate.mkdir()
        except FileExistsError:
            if (candidate / "config.json").exists() or (candidate / "metrics.jsonl").exists():
                continue  # another run's: not this one's to append to
        if k > 1:
            log.warning("%s holds another run (resume it with resume=%s): this run goes to %s", path, path, candidate)
        return candidate


def free_bytes(path: Path) -> int:
    """Free bytes on the disk of ``path`` (or of its nearest existing parent)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def base_model_path(cfg: RunConfig) -> Path:
    """The base model: ``model.path`` (and each member's own ``model``) checked; else the model tidal makes (and
    caches) by ``model.init``: its tiny model, warmed up, or random weights of ``model.shape``."""
    for where, path in [("model.path", cfg.model.path), *((f"league member {m.id}'s model", m.model)
                                                           for m in cfg.members())]:
        if path and not (Path(path).expanduser() / "config.json").exists():
            raise FileNotFoundError(f"{where}={path} is not a Hugging Face model directory (no config.json)")
    if cfg.model.path:
        return Path(cfg.model.path).expanduser()
    if cfg.model.init == "random":
        return ensure_random_model(cfg.model.cache_dir, random_model_config(cfg))
    return ensure_base_model(cfg.model.cache_dir, tiny_model_config(cfg))


class Driver:
    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        run = cfg.run
        default = ("league-" if cfg.league else "") + datetime.now().strftime("%Y%m%d-%H%M%S")
        self.dir = run_directory(Path(run.dir).expanduser(), run.name or default, resumed=cfg.resume is not None)
        self.lock = RunLock(self.dir, "its driver")  # before anything is written there: one driver a run
        (self.dir / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2))
        self.metrics = MetricsLog(self.dir, window_s=run.return_window_s, window_episodes=run.return_window_episodes,
                                  batch_episodes=cfg.replay.args.batch_episodes)
        if cfg.observe.tensorboard:  # every row as TensorBoard events too, written here: the actors pay nothing
            self.metrics.writers.append(TensorBoardLog(self.dir))
        if cfg.observe.wandb:  # and to Weights & Biases, the optional extra
            self.metrics.writers.append(WandbLog(self.dir, dataclasses.asdict(cfg), cfg.observe.wandb_project,
                                                 cfg.observe.wandb_mode))
        self.resumed = cfg.resume is not None
        # A resumed run continues its clock and its curves: its budget is the run's, not one more of it.
        self.offset_s = self.metrics.load() if self.resumed else 0.0
        self.past_evaluations = [r["evaluation"] for r in self.metrics.rows if "evaluation" in r]
        self.started = None
        self.target_reached_s = None
        self.training_end: dict | None = None  # the last metrics row of training, before the final evaluation
        self.restarts: dict[str, int] = {}  # actor -> times restarted after it died
        self.base_model: Path | None = None  # once made or found (``model_path``)
        self.restart_limit = RestartLimit(run.max_restarts, run.restart_window_s, run.restart_backoff_s)
        self.training = False  # env actors may start training episodes (a restarted one is told again)
        self.top: Topology | None = None
        self.steward: LeagueSteward | None = None
        self.scaler: Scaler | None = None  # once the run's actors are up
        self._stop = threading.Event()  # ``stop``: end training at the next round, as the budget would
        self._final_evaluation = True  # ``stop(evaluate=False)``: end without it, as on Ctrl-C

    # -- control, from any thread ------------------------------------------------------------------------

    def scale(self, kind: str, count: int) -> int:
        """Ask for ``count`` actors of ``kind`` (``rollout``, ``rollout-<member>`` or ``env``); applied by the
        run's loop at its next round. Returns how many it runs now. The control endpoint's thread calls it."""
        if self.scaler is None:
            raise ValueError("the run is still starting its actors: scale it once it trains")
        self.scaler.check(kind, count)
        self.scaler.requests.put((kind, count))
        return len(self.scaler.actors(kind))

    def stop(self, evaluate: bool = True) -> None:
        """End training at the run's next round, then evaluate (unless not ``evaluate``) and summarize as at the
        end of its budget. The control endpoint's thread calls it (``tidal stop``)."""
        self._final_evaluation = self._final_evaluation and evaluate
        self._stop.set()

    def _sweep(self) -> None:
        """Remove what this user's dead processes left in shared memory (weights of a killed learner or rollout)."""
        for root in {SHM_DIR, self.cfg.rollout.args.vllm.weights_dir} - {None}:
            for path in sweep_stale(root):
                log.info("removed %s, left by a process that died", path)

    # -- the run -----------------------------------------------------------------------------------------

    def model_path(self) -> Path:
        return base_model_path(self.cfg)

    def execute(self) -> dict:
        """The run, to its summary; its directory's lock is let go at the end, however it ends."""
        try:
            return self._execute()
        finally:
            self.lock.release()

    def _execute(self) -> dict:
        endpoint_games = self.cfg.eval.endpoint_games_per_seat
        model_path = self.model_path()
        # the first moment the run's tokenizers are at hand (the model tidal makes is made just now)
        members = [Path(m.model).expanduser() for m in self.cfg.members() if m.model]
        from transformers import AutoTokenizer  # each model's tokenizer once, for both checks

        paths = dict.fromkeys(map(str, [model_path, *members]))
        tokenizers = {path: AutoTokenizer.from_pretrained(path) for path in paths}
        problems = stop_problems_with(tokenizers, sampling_stops(self.cfg), self.cfg.sampling.max_new_tokens)
        problems += chat_problems(tokenizers, self.cfg.prompt.template)
        if problems:
            raise ValueError("; ".join(problems))
        self.base_model = model_path
        self._check_space()
        self._sweep()
        self.cluster = cluster = open_cluster(self.cfg.run, self.cfg.ray)
        interrupted, control, table = False, None, None
        try:
            self.top = top = build_topology(cluster, self.cfg, model_path, self.dir)
            if self.resumed:  # replay took over the previous life's live episodes: admission counts them
                count_inherited(cluster, top)
            self.recoveries = {m: GroupRecovery(cluster, group, top.envs) for m, group in top.groups.items()}
            mains = [m.id for m in self.cfg.league.members if m.role == "main"] if self.cfg.league else None
            self.evaluations = Evaluations(cluster, top.envs, self.cfg.eval, mains, self.past_evaluations)
            if top.league is not None:
                self.steward = LeagueSteward(cluster, top, self.dir, self.evaluations.results)
            self.scaler = Scaler(ScaleContext(self.cfg, cluster, top, self.evaluations, self.metrics, self.restarts,
                                              self.recover, lambda: self.training, self.set_training))
            control = ControlServer(self.dir, self.scale, self.stop)  # `tidal scale` and `tidal stop` reach it here
            self._evaluate_now("resume" if self.resumed else "start", endpoint_games)
            # minute 0 of the curves: training starts (a resumed run goes on from where its metrics stopped)
            self.started = self.metrics.started = time.time() - self.offset_s
            if self.resumed:  # what replay took over from the previous life goes to the learner first
                release_inherited(cluster, top)
            self.set_training(True)
            self._train()
            self.training_end = self.metrics.rows[-1] if self.metrics.rows else None
            self.set_training(False)
            if self._final_evaluation:
                self._evaluate_now("final", endpoint_games)
        except KeyboardInterrupt:
            interrupted = True
            log.warning("interrupted: stopping the run and writing what it measured")
        except BaseException:
            self._close_writers()  # what they were given is kept (a W&B run marked finished)
            raise
        finally:
            if control is not None:
                control.close()
            if self.scaler is not None:
                self.scaler.close()
            if self.steward is not None:
                table = self.steward.table_or_none()
            cluster.shutdown()  # a league writes its state as it stops
            self._sweep()
        return self._summarize(interrupted, table)

    def _close_writers(self) -> None:
        for writer in self.metrics.writers:
            writer.close()
        self.metrics.writers = []

    def set_training(self, on: bool, envs: list[str] | None = None) -> None:
        """Let the env actors (``envs``: these only) start training episodes, or stop them."""
        self.training = on
        for env in self.top.envs if envs is None else envs:  # one found dead is told by its restart
            call_unless_dead(handle(self.cluster, env, EnvFace).set_training, on)

    def recover(self, name: str, error: Exception) -> dict:
        """Restart a dead actor of any kind, losing nothing and counting nothing twice (docs/faults-and-scaling.md)."""
        if not self.cfg.run.restart:
            self._give_up(f"the {name} actor died ({type(error).__name__}) and run.restart is off", error)
        try:
            delay = self.restart_limit.delay(name)
        except RestartsExhausted as reason:
            self._give_up(str(reason), error)
        log.warning("%s died (%s); restarting it%s", name, type(error).__name__,
                    f" in {delay:.1f} s (its last restart was recent)" if delay else "")
        time.sleep(delay)
        incarnation = self.restarts[name] = self.restarts.get(name, 0) + 1
        top = self.top
        if name == top.league:
            self.steward.restart_league()
        elif name in top.envs:
            restart_env(self.cluster, name, incarnation, top.replays(), self.training, self.evaluations.open)
        else:  # rollout, reward, replay, learner: as in every member's group (recovery.py)
            group = top.group_of(name)
            self.recoveries[group.member].restart(name)
            if self.steward is not None and name in group.learner_group():
                self.steward.learner_restarted(group.member)
        self.metrics.restarted(name)
        self.restart_limit.restarted(name)
        return self.cluster.statistics(name)

    def resume_command(self) -> str:
        """The command that continues this run, with the settings a resume takes only from its command line."""
        command = "tidal league run" if self.cfg.league else "tidal launch"
        outside = outside_settings(dataclasses.asdict(self.cfg))
        return " ".join([command, f"resume={self.dir}", *(override(k, v) for k, v in outside.items())])

    def _give_up(self, reason: str, error: Exception) -> None:
        """End the run for ``reason``, saying how to resume it."""
        message = f"{reason}: the run stops; continue it with `{self.resume_command()}`"
        log.error(message)
        raise RuntimeError(message) from error

    def space_needed(self) -> int:
        """Bytes the run needs free on its directory's disk, at least: its checkpoints, each about three times the
        base model's weights (the policy, and Adam's two moments beside it)."""
        if self.base_model is None:
            return 0
        model = sum(p.stat().st_size for p in Path(self.base_model).glob("*.safetensors"))
        return CHECKPOINT_COPIES * 3 * model

    def _check_space(self) -> None:
        free, needed = free_bytes(self.dir), self.space_needed()
        if free < needed:
            log.warning("%s has %s free; the run's checkpoints alone need about %s there: it will stop when the "
                        "disk is full (then free space and resume it)", self.dir, mib(free), mib(needed))

    def _full_disk(self, full, error: Exception) -> None:
        """End the run for a full disk (``host.DiskFull``), saying where, what is free and what is needed."""
        where = Path(full.path) if full.path else self.dir
        self._give_up(f"{full}: a full disk is not a fault a restart fixes. {where} has {mib(free_bytes(where))} "
                      f"free; the run needs at least {mib(self.space_needed())} free under {self.dir} for its "
                      f"checkpoints ({CHECKPOINT_COPIES} at once, each the model's weights and optimizer state), "
                      "more for its replay spill and episode dataset (observe.dataset=false saves that). Free space "
                      "there", error)

    def _tick(self) -> dict[str, Any]:
        """Every actor's statistics (the health check: a dead actor is restarted here, one whose disk is full
        ends the run); the league's round."""
        try:
            stats = statistics_or_recover(self.cluster, self.top.names(), self.recover)
        except Exception as error:
            full = full_disk_error(error, "driver")  # an actor's, or the driver's own
            if full is None:
                raise
            self._full_disk(full, error)
        if self.steward is not None:
            self.steward.tick(stats)
        return stats

    def _row(self, stats: dict, evaluation: dict | None = None, rates: bool = True) -> dict:
        first = next(iter(self.top.groups.values()))
        extra = {"restarts_by_actor": dict(self.restarts), "scale_events": len(self.scaler.events),
                 **(self.steward.metrics(stats) if self.steward is not None else {})}
        return self.metrics.snapshot(stats, evaluation, learner=first.learner, replay=first.replay, extra=extra,
                                     rates=rates)

    def _evaluate_now(self, tag: str, games: int) -> None:
        """A round of evaluations, waited for; none for 0 ``games`` (``eval.endpoint_games_per_seat=0``: a run
        measured for its throughput alone, benchmarks/gpu_check.py --loop, has no start or final evaluation)."""
        if games == 0:
            return
        self.evaluations.start(tag, games)
        while self.evaluations.open:
            stats = self._tick()
            for i, result in enumerate(self.evaluations.collect(stats)):
                self._record(result, stats, rates=i == 0)
            if self.evaluations.open:
                time.sleep(POLL_S)

    def _record(self, result: dict, stats: dict, rates: bool = True) -> None:
        """An evaluation's result: kept, in a metrics row (``rates``: the first of this moment's rows)."""
        result["minute"] = (time.time() - self.started) / 60 if self.started else self.offset_s / 60
        self.evaluations.results.append(result)
        self._row(stats, evaluation=result, rates=rates)
        if self.steward is not None:
            self.steward.record_evaluation(result)
        log.info("evaluation %s: %s vs %s: non-loss %.3f (by seat %s), wins %.3f, invalid %.3f", result["tag"],
                 result["player"], result["opponent"], result["nonloss"],
                 {k: round(v, 3) for k, v in result["nonloss_by_seat"].items()}, result["win_rate"],
                 result["invalid_rate"])

    def _train(self) -> None:
        from tqdm import tqdm

        run, every_s = self.cfg.run, self.cfg.eval.every_s
        budget = run.minutes * 60
        bar = tqdm(total=round(budget), unit="s", disable=not run.progress, dynamic_ncols=True)
        next_eval = time.time() + every_s  # (a resumed run just evaluated, as "resume")
        while (elapsed := time.time() - self.started) < budget and not self._stop.is_set():
            time.sleep(min(run.log_every_s, max(budget - elapsed, 0.05)))
            self.scaler.apply()
            stats = self._tick()
            results = self.evaluations.collect(stats)
            for i, result in enumerate(results):
                self._record(result, stats, rates=i == 0)  # writes this round's metrics row too
            if not results:
                self._row(stats)
            row = self.metrics.rows[-1]
            self.scaler.autoscale(row)
            if not self.evaluations.open and every_s and time.time() >= next_eval and not self.scaler.busy:
                self.evaluations.start_during()
                next_eval = time.time() + every_s
            bar.update(min(round(time.time() - self.started), bar.total) - bar.n)
            bar.set_postfix(self._postfix(row), refresh=True)
            if self._budget_spent(row):
                break
        bar.close()

    def _budget_spent(self, row: dict) -> bool:
        run = self.cfg.run
        if run.max_versions and row["version"] >= run.max_versions:
            return True
        if run.max_matches and row.get("matches", 0) >= run.max_matches:
            return True
        target, reward = run.target_return, row.get("train_return")
        if target is not None and reward is not None and reward >= target:
            self.target_reached_s = time.time() - self.started
            log.info("training return %.3f reached the target %.3f after %.1f s", reward, target,
                     self.target_reached_s)
            return True
        return False

    def _postfix(self, row: dict) -> dict:
        results = self.evaluations.results
        last = results[-1]["nonloss"] if results else None
        return {"v": row["version"], "eps/s": f"{row.get('episodes_per_s', 0):.0f}",
                "tok/s": f"{row.get('tokens_per_s', 0):.0f}",
                "stale": f"{row.get('staleness_mean', 0):.1f}", "nonloss": f"{last:.2f}" if last is not None else "-"}

    def _summarize(self, interrupted: bool, table: dict | None) -> dict:
        rows = self.metrics.rows
        evaluations = self.evaluations.results if self.top is not None else self.past_evaluations
        by_tag = {e["tag"]: e for e in evaluations}
        start, final = by_tag.get("start"), by_tag.get("final")
        rates = [r["episodes_per_s"] for r in rows if r.get("episodes_per_s")]
        trained = self.training_end or (rows[-1] if rows else {})  # busy and idle while training, not evaluating
        summary = {
            "run_dir": str(self.dir),
            "interrupted": interrupted,
            "stopped": self._stop.is_set(),  # by `tidal stop` (or the driver's ``stop``)
            "minutes": (time.time() - self.started) / 60 if self.started else 0.0,
            "start_nonloss": start["nonloss"] if start else None,
            "final_nonloss": final["nonloss"] if final else None,
            "final_version": rows[-1]["version"] if rows else 0,
            "episodes": rows[-1]["episodes"] if rows else 0,
            "episodes_per_s": sum(rates) / len(rates) if rates else None,
            "turns": rows[-1]["turns"] if rows else 0,  # the policy's moves and the tokens sampled, evaluations too
            "tokens": rows[-1]["tokens"] if rows else 0,
            "truncated_actions": rows[-1].get("truncated_actions", 0) if rows else 0,
            "context_full_episodes": rows[-1].get("context_full_episodes", 0) if rows else 0,
            "train_return": next((r["train_return"] for r in reversed(rows) if r.get("train_return") is not None), None),
            "target_reached_s": self.target_reached_s,
            "learner_busy": trained.get("learner_busy"),
            "rollout_idle": trained.get("rollout_idle"),
            "staleness_hist": rows[-1].get("staleness_total") if rows else {},
            "rejected_episodes": rows[-1].get("rejected_episodes") if rows else 0,
            "rejected_turns": rows[-1].get("rejected_turns", 0) if rows else 0,
            "guard_trips": next((r["guard_trips"] for r in reversed(rows) if "guard_trips" in r), 0),
            "eta_last": next((r["eta"] for r in reversed(rows) if "eta" in r), None),
            "restarts": self.restarts,
            "scale_events": self.scaler.events if self.scaler is not None else [],
            "life": self.top.life if self.top is not None else None,
            "evaluations": evaluations,
        }
        if self.cfg.league is not None:
            summary["table"] = table
            summary["league_results_lost"] = self.steward.results_lost if self.steward else 0
        (self.dir / "summary.json").write_text(json.dumps(summary, indent=2))
        self._close_writers()
        if evaluations and self.cfg.league is None:
            plot_learning_curve(evaluations, rows, self.dir / "learning_curve.png", self.cfg.eval.opponent)
        return summary
