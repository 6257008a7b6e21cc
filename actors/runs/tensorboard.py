"""TensorBoard, live: every metrics row the driver writes also goes to TensorBoard event files.

The driver already gathers every actor's statistics into one row per ``run.log_every_s`` (``monitor.py``); this
writer turns each row into scalars, histograms and evaluation curves in ``<run dir>/tensorboard``, in the
driver's process, so the actors pay nothing. ``tensorboard --logdir runs/`` then shows every run side by side
(a resumed run appends to its own directory: its steps go on from the elapsed seconds it stopped at).

Tags: ``<section>/<key>`` for each number in a row (sections below; nested numbers such as a league's ratings
per member as ``league/ratings/<member>``), the staleness of the last batch's tokens and of every token so far as
histograms, and each evaluation as ``eval/<player>_vs_<opponent>/{nonloss, seat<k>, win_rate, invalid_rate}``.
The step is the run's elapsed training seconds.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

log = logging.getLogger(__name__)
TENSORBOARD_DIR = "tensorboard"
SECTIONS = {
    "throughput": ("episodes_per_s", "tokens_per_s", "episodes", "turns", "tokens", "trained_episodes",
                   "live_episodes", "train_episodes", "version", "data_cursor"),
    "system": ("learner_busy", "learner_train_s", "rollout_idle", "queue_requests", "queue_replay", "rollout_actors",
               "env_actors", "dropped_frames", "dataset_cpu_s"),
    "faults": ("restarts", "rejected_episodes", "rejected_turns", "reissued_requests", "duplicate_completions",
               "guard_trips", "guard_cooldown", "restarts_by_actor", "scale_events"),
    "staleness": ("staleness_mean", "staleness_max", "eta", "is_ess", "is_weight_mean", "is_outside_share",
                  "logprob_gap", "logprob_gap_same_version", "step_scale"),
    "loss": ("pg_loss", "clip_fraction", "approx_kl", "entropy", "kl_ref", "lr"),
    "train": ("train_return", "invalid_rate", "invalid_share", "train_return_sum", "invalid_actions"),
}
SECTION_OF = {key: section for section, keys in SECTIONS.items() for key in keys}
# key -> (tag, whether its counts are keyed by bins' upper edges; else by integer values)
HISTOGRAMS = {"staleness_hist": ("staleness/batch_tokens", False), "staleness_total": ("staleness/all_tokens", False),
              "is_weight_hist": ("staleness/importance_weights", True)}
SKIPPED = {"time", "elapsed_s", "evaluation", "tensorboard_cpu_s"}


def section(key: str) -> str:
    if key in SECTION_OF:
        return SECTION_OF[key]
    if key.startswith(("return_", "turns_role_", "invalid_role_", "invalid_rate_role_", "task_")):
        return "roles" if "role" in key or key.startswith("task_") else "train"
    if key in ("matches", "snapshots", "ratings", "versions"):
        return "league"
    return "streams"


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


class TensorBoardLog:
    """Writes metrics rows as TensorBoard events under ``<run_dir>/tensorboard``."""

    def __init__(self, run_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.dir = Path(run_dir) / TENSORBOARD_DIR
        self.writer = SummaryWriter(str(self.dir), flush_secs=5)
        self.tags: set[str] = set()
        self.cpu_s = 0.0  # the driver's CPU time spent writing (the writer's own flushing thread aside)

    def write(self, row: dict) -> None:
        started = time.thread_time()
        self._write(row)
        self.cpu_s += time.thread_time() - started

    def _write(self, row: dict) -> None:
        step, walltime = int(round(row.get("elapsed_s", 0.0))), row.get("time")
        for key, value in row.items():
            if key in SKIPPED:
                continue
            if key in HISTOGRAMS and isinstance(value, dict):
                self._histogram(*HISTOGRAMS[key], value, step, walltime)
            else:
                self._scalars(f"{section(key)}/{key}", value, step, walltime)
        if row.get("evaluation"):
            self.evaluation(row["evaluation"], walltime)

    def evaluation(self, result: dict, walltime: float | None = None) -> None:
        """An evaluation's figures, at the minute it landed (as the learning curve plots them)."""
        step = int(round(result.get("minute", 0.0) * 60))
        where = f"eval/{result.get('player', 'policy')}_vs_{result['opponent']}"
        self._scalars(f"{where}/nonloss", result.get("nonloss"), step, walltime)
        for seat, rate in result.get("nonloss_by_seat", {}).items():
            self._scalars(f"{where}/seat{seat}", rate, step, walltime)
        for key in ("win_rate", "invalid_rate"):
            self._scalars(f"{where}/{key}", result.get(key), step, walltime)

    def _scalars(self, tag: str, value, step: int, walltime) -> None:
        """A number as one scalar; a dict of numbers (a league's ratings per member) as one tag each."""
        if is_number(value):
            self.writer.add_scalar(tag, value, step, walltime=walltime)
            self.tags.add(tag)
        elif isinstance(value, dict):
            for key, inner in value.items():
                self._scalars(f"{tag}/{key}", inner, step, walltime)

    def _histogram(self, tag: str, binned: bool, counts: dict, step: int, walltime) -> None:
        """A histogram from counts: of integer values (staleness in versions: each bucket ends half a version
        above its value), or (``binned``) of bins keyed by their upper edges (importance weights)."""
        values = sorted((float(k), int(n)) for k, n in counts.items() if int(n) > 0)
        if not values:
            return
        limits = [k if binned else k + 0.5 for k, _ in values]
        total = sum(n for _, n in values)
        self.writer.add_histogram_raw(
            tag, min=values[0][0], max=values[-1][0], num=total, sum=float(sum(k * n for k, n in values)),
            sum_squares=float(sum(k * k * n for k, n in values)), bucket_limits=limits,
            bucket_counts=[n for _, n in values], global_step=step, walltime=walltime)
        self.tags.add(tag)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
