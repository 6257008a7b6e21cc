"""How a metrics row becomes named figures: what the live writers (TensorBoard, Weights & Biases) share.

The driver gathers every actor's statistics into one row per ``run.log_every_s`` (``monitor.py``). A writer
(``RowWriter``) turns each row into scalars, histograms and evaluation curves, in the driver's process, so the
actors pay nothing; each writer only says how one scalar and one histogram are written.

Tags: ``<section>/<key>`` for each number in a row (sections below; nested numbers such as a league's ratings
per member as ``league/ratings/<member>``), the staleness of the last batch's tokens and of every token so far as
histograms, and each evaluation as ``eval/<player>_vs_<opponent>/{nonloss, seat<k>, win_rate, invalid_rate}``.
The step is the run's elapsed training seconds (a resumed run goes on from the seconds it stopped at).
"""

from __future__ import annotations

import time

SECTIONS = {
    "throughput": ("episodes_per_s", "tokens_per_s", "episodes", "turns", "tokens", "trained_episodes",
                   "live_episodes", "train_episodes", "version", "data_cursor"),
    "system": ("learner_busy", "learner_train_s", "rollout_idle", "queue_requests", "queue_replay", "rollout_actors",
               "rollout_requests", "env_actors", "dropped_frames", "dataset_cpu_s"),
    "faults": ("restarts", "rejected_episodes", "rejected_turns", "reissued_requests", "duplicate_completions",
               "guard_trips", "guard_cooldown", "restarts_by_actor", "scale_events", "unscored_episodes",
               "rejected_by_reward", "rejected_by_replay", "refused_by_replay", "lost_completions", "given_back",
               "stalled_rows"),
    "staleness": ("staleness_mean", "staleness_max", "eta", "is_ess", "is_weight_mean", "is_outside_share",
                  "logprob_gap", "logprob_gap_same_version", "step_scale"),
    "loss": ("pg_loss", "clip_fraction", "approx_kl", "entropy", "kl_ref", "lr"),
    "train": ("train_return", "invalid_rate", "invalid_share", "train_return_sum", "invalid_actions",
              "unreadable_rate", "unreadable_actions"),
}
SECTION_OF = {key: section for section, keys in SECTIONS.items() for key in keys}
# key -> (tag, whether its counts are keyed by bins' upper edges; else by integer values)
HISTOGRAMS = {"staleness_hist": ("staleness/batch_tokens", False), "staleness_total": ("staleness/all_tokens", False),
              "is_weight_hist": ("staleness/importance_weights", True)}
SKIPPED = {"time", "elapsed_s", "evaluation", "tensorboard_cpu_s", "wandb_cpu_s"}  # the writers' own costs


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


class RowWriter:
    """Writes metrics rows as figures: a subclass says how a scalar (``scalar``) and a histogram (``histogram``)
    are written, and may gather a row's figures until ``row_done``. ``name`` keys its cost in the rows,
    ``<name>_cpu_s``: the driver's CPU time spent writing (a library's own flushing thread aside)."""

    name = "writer"

    def __init__(self):
        self.tags: set[str] = set()
        self.cpu_s = 0.0

    def write(self, row: dict) -> None:
        started = time.thread_time()
        step, walltime = int(round(row.get("elapsed_s", 0.0))), row.get("time")
        for key, value in row.items():
            if key in SKIPPED:
                continue
            if key in HISTOGRAMS and isinstance(value, dict):
                self._histogram(*HISTOGRAMS[key], value, step, walltime)
            else:
                self._scalars(f"{section(key)}/{key}", value, step, walltime)
        self.row_done(step, walltime)
        if row.get("evaluation"):
            self.evaluation(row["evaluation"], walltime)
        self.cpu_s += time.thread_time() - started

    def evaluation(self, result: dict, walltime: float | None = None) -> None:
        """An evaluation's figures, at the minute it landed (as the learning curve plots them)."""
        step = int(round(result.get("minute", 0.0) * 60))
        where = f"eval/{result.get('player', 'policy')}_vs_{result['opponent']}"
        self._scalars(f"{where}/nonloss", result.get("nonloss"), step, walltime)
        for seat, rate in result.get("nonloss_by_seat", {}).items():
            self._scalars(f"{where}/seat{seat}", rate, step, walltime)
        for key in ("win_rate", "invalid_rate"):
            self._scalars(f"{where}/{key}", result.get(key), step, walltime)
        self.row_done(step, walltime)

    def _scalars(self, tag: str, value, step: int, walltime) -> None:
        """A number as one scalar; a dict of numbers (a league's ratings per member) as one tag each."""
        if is_number(value):
            self.scalar(tag, value, step, walltime)
            self.tags.add(tag)
        elif isinstance(value, dict):
            for key, inner in value.items():
                self._scalars(f"{tag}/{key}", inner, step, walltime)

    def _histogram(self, tag: str, binned: bool, counts: dict, step: int, walltime) -> None:
        """A histogram from counts: of integer values (staleness in versions), or (``binned``) of bins keyed by
        their upper edges (importance weights). Empty counts write nothing."""
        values = sorted((float(k), int(n)) for k, n in counts.items())
        if not any(n > 0 for _, n in values):
            return
        self.histogram(tag, values, binned, step, walltime)
        self.tags.add(tag)

    def scalar(self, tag: str, value: float, step: int, walltime) -> None:
        raise NotImplementedError

    def histogram(self, tag: str, values: list[tuple[float, int]], binned: bool, step: int, walltime) -> None:
        """``values``: (value or bin's upper edge, count) in increasing order, some counts maybe 0."""
        raise NotImplementedError

    def row_done(self, step: int, walltime) -> None:
        """Every figure of one row (or one evaluation) at ``step`` has been given."""

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass
