"""Watching a run: metrics from every actor, rates between snapshots, and the learning-curve plot."""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from pathlib import Path

from streams.stats import stream_totals

log = logging.getLogger(__name__)


# counters that a restarted env or rollout actor starts again from 0, and that the run's totals continue (a
# restarted learner takes its own back from its checkpoint; replay and reward's are not summed into totals)
CONTINUED = ("episodes", "train_episodes", "train_return_sum", "turns", "invalid_actions", "unreadable_actions",
             "tokens", "reissued_requests", "duplicate_completions", "requests", "lost_completions")
STALL_ROWS = 5  # metrics rows with nothing that could make a batch before the run is said to be stalled
CONTINUED_KINDS = ("env", "rollout")


class ContinuedCounters:
    """The CONTINUED counters of env and rollout actors, carried on over restarts and scale-downs: what a dead
    or retired actor had counted stays in the totals, so they never go back (no negative rates)."""

    def __init__(self):
        self._seen: dict[str, dict] = {}  # actor -> its CONTINUED counters in the last snapshot
        self._before: dict[str, dict] = {}  # actor -> what its dead predecessors had counted
        self._retired_names: set[str] = set()  # actors gone for good; their counts stay in the totals

    def restarted(self, name: str) -> None:
        before = self._before.setdefault(name, {})
        for key, value in self._seen.get(name, {}).items():
            before[key] = before.get(key, 0) + value
        self._seen[name] = {}

    def retired(self, name: str) -> None:
        self.restarted(name)
        self._retired_names.add(name)

    def apply(self, stats: dict[str, dict]) -> dict[str, dict]:
        """``stats`` (actor -> statistics) with every counter carried on; retired actors keep a row of theirs."""
        out = {}
        for name, s in stats.items():
            if not name.startswith(CONTINUED_KINDS):
                out[name] = s
                continue
            self._seen[name] = {key: s[key] for key in CONTINUED if key in s}
            out[name] = {**s, **{key: s[key] + value for key, value in self._before.get(name, {}).items() if key in s}}
        for name in self._retired_names - set(stats):  # gone: only what it counted, under its own name
            out[name] = {**dict.fromkeys(CONTINUED, 0), **self._before[name], "streams": {}, "retired": True}
        return out


class StallWatch:
    """Says, once a stall, that the run cannot move: the learner's version has not moved for ``rows`` metrics rows
    while replay holds fewer than a batch (``batch_episodes``) and no episode is live, so no batch can form and
    nothing under way will change that. Whatever the cause (admission exhausted by episodes never given back, a
    scorer dropping everything), the run looks idle, and the row's drop counts say where episodes went."""

    def __init__(self, batch_episodes: int, rows: int = STALL_ROWS):
        self.batch_episodes, self.rows = batch_episodes, rows
        self._version, self._still = None, 0

    def observe(self, row: dict) -> int:
        """Rows in a row with nothing that could make a batch (0: moving); warns once when it reaches ``rows``."""
        idle = row["queue_replay"] < self.batch_episodes and row["live_episodes"] == 0
        if row["version"] != self._version or not idle:
            self._version, self._still = row["version"], 0
            return 0
        self._still += 1
        if self._still == self.rows:
            log.warning("the run is stalled: the learner's version has stayed at %s for %d metrics rows while replay "
                        "holds %d episodes, fewer than a batch of %d, and no episode is live; episodes dropped so far: "
                        "unscored %d, rejected by reward %d, rejected by replay %d, refused by replay %d, lost "
                        "completions %d; given back by the env actors, by reason: %s", row["version"], self._still,
                        row["queue_replay"], self.batch_episodes, row["unscored_episodes"], row["rejected_by_reward"],
                        row["rejected_by_replay"], row["refused_by_replay"], row["lost_completions"],
                        row["given_back"])
        return self._still


def dropped_figures(stats: dict[str, dict], envs: list[dict]) -> dict:
    """Where the episodes that will never be trained on went: dropped by the reward actors (unscored, rejected
    whole) and by replay (rejected whole, refused as too large), their completions lost in the env actors; and
    the env actors' admission given back, by reason (actors/env/admission.py). Reward and replay count in their
    own life (a restarted one starts again from 0)."""
    rewards = [s for name, s in stats.items() if name.startswith("reward")]
    replays = [s for name, s in stats.items() if name.startswith("replay")]
    given_back = Counter()
    for s in envs:
        given_back.update(s.get("given_back_by_reason", {}))
    return {"unscored_episodes": sum(s.get("unscored", 0) for s in rewards),
            "rejected_by_reward": sum(s.get("rejected_episodes", 0) for s in rewards),
            "rejected_by_replay": sum(s.get("rejected_episodes", 0) for s in replays),
            "refused_by_replay": sum(s.get("refused_episodes", 0) for s in replays),
            "lost_completions": sum(s.get("lost_completions", 0) for s in envs),
            "given_back": dict(given_back)}


class MetricsLog:
    """Appends one JSON line per snapshot to ``metrics.jsonl`` and derives rates between snapshots; warns when the
    run is stalled (``StallWatch``; ``batch_episodes`` 0: never)."""

    def __init__(self, run_dir: Path, window_s: float = 30.0, window_episodes: int = 0, batch_episodes: int = 0):
        self.path = run_dir / "metrics.jsonl"
        self.window_s, self.window_episodes = window_s, window_episodes
        self._history: list[tuple[float, int, float]] = []  # (time, training episodes, their return sum)
        self.started: float | None = None  # when training started; rows before it are at minute 0 (or the
        self._elapsed_before = 0.0          # minute a resumed run stopped at)
        self._last: tuple[float, dict] | None = None
        self.rows: list[dict] = []
        self.counters = ContinuedCounters()
        self.restarts = 0
        self.writers: list = []  # live writers (figures.py: TensorBoard, W&B): each row goes to them too
        self.stall = StallWatch(batch_episodes)

    def restarted(self, name: str) -> None:
        """``name`` died and was restarted: what it had counted stays in the totals (no negative rates)."""
        self.restarts += 1
        self.counters.restarted(name)

    def retired(self, name: str) -> None:
        """``name`` left the run (a scale-down): what it counted stays in the totals."""
        self.counters.retired(name)

    def load(self) -> float:
        """Take back the rows a run (being resumed) already wrote; returns the elapsed seconds they cover."""
        if not self.path.exists():
            return 0.0
        with self.path.open() as f:
            for number, line in enumerate(f, 1):
                try:
                    self.rows.append(json.loads(line))
                except json.JSONDecodeError:  # the last line of a killed run may be cut short
                    log.warning("%s:%d is not a whole metrics row; skipped", self.path, number)
        self._elapsed_before = self.rows[-1]["elapsed_s"] if self.rows else 0.0
        return self._elapsed_before

    def _train_return(self, now: float, totals: dict) -> float | None:
        """The policy's mean return over the training episodes that ended in the last ``window_s``, and at
        least the last ``window_episodes`` of them: a window of a handful of episodes (a synchronous run waiting
        for the last, slow episodes of a batch) would be noise. None until that many have ended."""
        ended_now = totals["train_episodes"]
        self._history.append((now, ended_now, totals["train_return_sum"]))

        def covers_window(entry) -> bool:
            return entry[0] <= now - self.window_s and entry[1] <= ended_now - self.window_episodes

        while len(self._history) > 2 and covers_window(self._history[1]):
            self._history.pop(0)
        _, episodes, returns = self._history[0]
        ended = ended_now - episodes
        if not ended or ended < self.window_episodes:
            return None
        return (totals["train_return_sum"] - returns) / ended

    def snapshot(self, stats: dict[str, dict], evaluation: dict | None = None, learner: str = "learner",
                 replay: str = "replay", extra: dict | None = None, rates: bool = True) -> dict:
        """One metrics row from every actor's ``stats``: totals over the env and rollout actors, and the run's
        policy's ``learner`` and ``replay`` (a league's first member's; ``extra`` adds the league's own).
        ``rates=False``: a further row of the same moment (a round's other evaluations) measures no rates."""
        now = time.time()
        stats = self.counters.apply(stats)
        replay, learner = stats.get(replay, {}), stats[learner]
        envs = [s for name, s in stats.items() if name.startswith("env")]
        rollouts = [s for name, s in stats.items() if name.startswith("rollout")]
        live_rollouts = [s for s in rollouts if not s.get("retired")]
        totals = {
            "episodes": sum(s["episodes"] for s in envs),
            "train_episodes": sum(s.get("train_episodes", 0) for s in envs),
            "train_return_sum": sum(s.get("train_return_sum", 0.0) for s in envs),
            "turns": sum(s["turns"] for s in envs),
            "invalid_actions": sum(s["invalid_actions"] for s in envs),
            "unreadable_actions": sum(s.get("unreadable_actions", 0) for s in envs),  # among the invalid ones
            "tokens": sum(s["tokens"] for s in rollouts),
        }
        elapsed = now - self.started if self.started is not None else self._elapsed_before
        row = {"time": now, "elapsed_s": elapsed, "version": learner["version"], **totals, "restarts": self.restarts,
               "trained_episodes": learner["episodes"], "data_cursor": learner.get("cursor"),
               "learner_train_s": learner["train_s"],
               "learner_busy": learner.get("busy"),
               "rollout_idle": sum(s.get("idle_fraction", 0.0) for s in rollouts) / max(len(live_rollouts), 1),
               "queue_requests": sum(s.get("queued_requests", 0) for s in rollouts),
               "rollout_actors": len(live_rollouts),
               "rollout_requests": {name: s.get("requests", 0) for name, s in stats.items()
                                    if name.startswith("rollout")},  # what each has answered so far
               "env_actors": sum(not s.get("retired") for s in envs),
               "queue_replay": replay.get("buffered", 0),
               "live_episodes": sum(s.get("live_episodes", 0) for s in envs),
               "rejected_episodes": learner.get("rejected_episodes", 0),
               "rejected_turns": learner.get("rejected_turns", 0),
               "reissued_requests": sum(s.get("reissued_requests", 0) for s in envs),
               "duplicate_completions": sum(s.get("duplicate_completions", 0) for s in envs),
               "staleness_total": learner.get("staleness_hist", {}),
               "dropped_frames": sum(s.get("dropped_frames", 0) for s in stats.values()),
               "truncated_actions": sum(s.get("truncated_actions", 0) for s in envs),  # cut at max_new_tokens
               "context_full_episodes": sum(s.get("context_full_episodes", 0) for s in envs),
               "dataset_cpu_s": learner.get("dataset", {}).get("cpu_s"),
               **dropped_figures(stats, envs)}
        row.update(stream_totals([s for actor in stats.values() for s in actor.get("streams", {}).values()]))
        if extra:
            row.update(extra)
        if rates and self._last is not None:
            then, before = self._last
            dt = max(now - then, 1e-9)
            row["episodes_per_s"] = (totals["episodes"] - before["episodes"]) / dt
            row["tokens_per_s"] = (totals["tokens"] - before["tokens"]) / dt
            turns = totals["turns"] - before["turns"]
            row["invalid_rate"] = (totals["invalid_actions"] - before["invalid_actions"]) / turns if turns else None
            row["unreadable_rate"] = ((totals["unreadable_actions"] - before["unreadable_actions"]) / turns
                                      if turns else None)
        row["train_return"] = self._train_return(now, totals)
        if rates and self.stall.batch_episodes and self.started is not None:  # training: a batch is due
            row["stalled_rows"] = self.stall.observe(row)
        row.update(role_figures(envs, learner))
        for key in ("staleness_mean", "staleness_max", "staleness_hist", "pg_loss", "clip_fraction", "approx_kl",
                    "logprob_gap", "logprob_gap_same_version", "is_weight_mean", "is_outside_share", "entropy",
                    "return_seat0", "return_seat1", "kl_ref", "lr", "states_known", "states_tracked", "eta", "is_ess",
                    "guard_trips", "guard_cooldown", "step_scale", "invalid_share", "is_weight_hist", "rows",
                    "rows_trained"):
            if key in learner.get("last", {}):
                row[key] = learner["last"][key]
        if evaluation is not None:
            row["evaluation"] = evaluation
        if rates:
            self._last = (now, totals)
        for writer in self.writers:  # what watching has cost the driver so far, measured
            row[f"{writer.name}_cpu_s"] = writer.cpu_s
        self.rows.append(row)
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        for writer in self.writers:
            writer.write(row)
        return row


def episodes_per_s(rows: list[dict], since: float, until: float) -> float | None:
    """Episodes finished per second between the first and the last metrics row in [since, until] (wall-clock
    times), from the run's totals: the rate of one phase of a run (e.g. between two scale events). None if
    fewer than two rows fall inside."""
    inside = [r for r in rows if since <= r["time"] <= until]
    if len(inside) < 2 or inside[-1]["time"] <= inside[0]["time"]:
        return None
    return (inside[-1]["episodes"] - inside[0]["episodes"]) / (inside[-1]["time"] - inside[0]["time"])


def role_figures(envs: list[dict], learner: dict) -> dict:
    """A role game's figures: per role, turns and invalid moves so far over the env actors and the learner's last
    return; the task buffer's size, mean solve rate and the kinds of the recent proposals. Empty for a game without
    roles."""
    figures = {}
    for role in sorted({role for s in envs for role in s.get("turns_by_role", {})}):
        turns = sum(s.get("turns_by_role", {}).get(role, 0) for s in envs)
        invalid = sum(s.get("invalid_by_role", {}).get(role, 0) for s in envs)
        figures.update({f"turns_role_{role}": turns, f"invalid_role_{role}": invalid,
                        f"invalid_rate_role_{role}": invalid / turns})
    buffers = [s["task_buffer"] for s in envs if "task_buffer" in s]
    if buffers:
        rates = [b["mean_solve_rate"] for b in buffers if b.get("mean_solve_rate") is not None]
        figures.update(task_buffer_size=max(b["size"] for b in buffers),
                       task_solve_rate=sum(rates) / len(rates) if rates else None)
        kinds = Counter()  # what the recent proposals asked, over the env actors (``envs.propose_solve.task_kind``)
        for b in buffers:
            kinds.update(b.get("recent_kinds", {}))
        figures.update({f"task_kind_share_{kind}": count / kinds.total() for kind, count in sorted(kinds.items())})
    figures.update({key: value for key, value in learner.get("last", {}).items() if key.startswith("return_role_")})
    return figures


def plot_learning_curve(evaluations: list[dict], rows: list[dict], path: Path, opponent: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ((ax1, ax2), (ax4, ax5)) = plt.subplots(2, 2, figsize=(11, 8))
    minutes = [e["minute"] for e in evaluations]
    ax1.plot(minutes, [e["nonloss"] for e in evaluations], "o-", label="non-loss, mean of seats")
    for seat in sorted({s for e in evaluations for s in e["nonloss_by_seat"]}):
        ax1.plot(minutes, [e["nonloss_by_seat"].get(seat) for e in evaluations], ".--", label=f"seat {seat}")
    ax1.set(xlabel="minutes", ylabel=f"rate vs {opponent}", ylim=(0, 1.02), title="evaluation")
    ax1.legend(loc="lower right")
    ax1.grid(alpha=0.3)
    trained = [r for r in rows if r.get("invalid_rate") is not None]
    ax2.plot([r["elapsed_s"] / 60 for r in trained], [r["invalid_rate"] for r in trained], label="invalid-action rate")
    roles = sorted({k for r in rows for k in r if k.startswith("return_role_")})
    for key in roles:  # each role's training return
        shown = [r for r in rows if r.get(key) is not None]
        ax2.plot([r["elapsed_s"] / 60 for r in shown], [r[key] for r in shown], ":", label=key[len("return_"):])
    ax2.set(xlabel="minutes", ylabel="rate, return" if roles else "rate", ylim=(-1.02, 1.02) if roles else (0, 1.02),
            title="training episodes")
    ax2.grid(alpha=0.3)
    ax3 = ax2.twinx()
    ax3.plot([r["elapsed_s"] / 60 for r in rows], [r["version"] for r in rows], color="gray", label="policy version")
    ax3.set_ylabel("policy version")
    lines = ax2.get_lines() + ax3.get_lines()
    ax2.legend(lines, [line.get_label() for line in lines], loc="upper right", fontsize=8)
    plot_system(ax4, ax5, rows)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_system(staleness_ax, system_ax, rows: list[dict]) -> None:
    """The run's system figures over time: the staleness of each batch's tokens (and the bound eta), the
    learner's busy and the rollout actors' idle fractions, and episodes/s."""
    def series(key):
        shown = [r for r in rows if r.get(key) is not None]
        return [r["elapsed_s"] / 60 for r in shown], [r[key] for r in shown]

    for key, style in (("staleness_mean", "-"), ("staleness_max", ":"), ("eta", "--")):
        staleness_ax.plot(*series(key), style, label=key)
    staleness_ax.set(xlabel="minutes", ylabel="versions", title="staleness of the trained tokens")
    staleness_ax.grid(alpha=0.3)
    staleness_ax.legend(loc="upper right", fontsize=8)
    for key in ("learner_busy", "rollout_idle"):
        system_ax.plot(*series(key), label=key)
    system_ax.set(xlabel="minutes", ylabel="fraction", ylim=(0, 1.02), title="utilisation and throughput")
    system_ax.grid(alpha=0.3)
    rate_ax = system_ax.twinx()
    rate_ax.plot(*series("episodes_per_s"), color="gray", label="episodes/s")
    rate_ax.set_ylabel("episodes/s")
    lines = system_ax.get_lines() + rate_ax.get_lines()
    system_ax.legend(lines, [line.get_label() for line in lines], loc="lower right", fontsize=8)
