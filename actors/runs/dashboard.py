"""``tidal top [run]``: a live terminal dashboard of a running or finished run.

It reads what the run writes (``metrics.jsonl``, ``summary.json``, ``control.json`` while it runs, the episode
dataset's files) and needs no Ray: versions and rates, the learner's busy and the rollout actors' idle fractions,
queues, a histogram of the staleness of every token trained so far, actors per kind with their restarts, scaling
events, the last evaluations and, in a league, its ratings.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from rich.console import Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table

from actors.learner.dataset import DATASET_DIR
from actors.runs.control import CONTROL_FILE

BAR_WIDTH = 40


def read_rows(run_dir: Path) -> list[dict]:
    """The run's metrics rows (a cut-off last line, being written, is left for the next look)."""
    path = run_dir / "metrics.jsonl"
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return rows


def run_state(run_dir: Path) -> str:
    if (run_dir / CONTROL_FILE).exists():
        return "running"
    if (run_dir / "summary.json").exists():
        return "finished"
    return "not running, no summary" if (run_dir / "metrics.jsonl").exists() else "starting"


def fmt(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def figures(row: dict, run_dir: Path) -> Table:
    table = Table(title="run", show_header=False, box=None)
    dataset = list((run_dir / DATASET_DIR).glob("*/*/batch-*.parquet"))
    for label, key in (("policy version", "version"), ("elapsed (min)", None), ("episodes", "episodes"),
                       ("trained episodes", "trained_episodes"), ("episodes/s", "episodes_per_s"),
                       ("tokens/s", "tokens_per_s"), ("train return", "train_return"),
                       ("invalid rate", "invalid_rate"), ("eta (staleness bound)", "eta"),
                       ("staleness mean / max", None), ("learner busy", "learner_busy"),
                       ("rollout idle", "rollout_idle"), ("queued requests", "queue_requests"),
                       ("replay buffered", "queue_replay"), ("live episodes", "live_episodes")):
        if label == "elapsed (min)":
            value = fmt(row.get("elapsed_s", 0.0) / 60, 1)
        elif label.startswith("staleness"):
            value = f"{fmt(row.get('staleness_mean'), 2)} / {fmt(row.get('staleness_max'))}"
        else:
            value = fmt(row.get(key))
        table.add_row(label, value)
    table.add_row("dataset batches", str(len(dataset)))
    return table


def actors_table(row: dict, summary: dict) -> Table:
    table = Table(title="actors")
    for column in ("kind", "count", "restarts"):
        table.add_column(column)
    restarts = row.get("restarts_by_actor") or summary.get("restarts") or {}
    for kind, count in (("rollout", row.get("rollout_actors")), ("env", row.get("env_actors")),
                        ("learner", 1), ("replay", 1), ("reward", 1)):
        table.add_row(kind, fmt(count), str(sum(n for name, n in restarts.items() if name.startswith(kind))))
    table.add_row("all", "", f"{row.get('restarts', 0)} (scale events: {row.get('scale_events', 0)})")
    table.add_row("faults", "", f"rejected {row.get('rejected_episodes', 0)} episodes, reissued "
                                f"{row.get('reissued_requests', 0)}, duplicates {row.get('duplicate_completions', 0)}, "
                                f"dropped frames {row.get('dropped_frames', 0)}")
    return table


def staleness_histogram(counts: dict) -> Table:
    """Every token trained so far, by its staleness (versions behind the learner)."""
    table = Table(title="staleness of trained tokens", show_header=False, box=None)
    values = sorted((int(k), int(n)) for k, n in (counts or {}).items())
    total = sum(n for _, n in values) or 1
    top = max((n for _, n in values), default=1) or 1
    for staleness, n in values:
        table.add_row(str(staleness), "█" * max(round(BAR_WIDTH * n / top), 1 if n else 0), f"{n / total:.1%}")
    return table


def evaluations_table(rows: list[dict], last: int = 6) -> Table:
    table = Table(title="last evaluations")
    for column in ("minute", "tag", "player", "opponent", "non-loss", "by seat", "wins", "invalid"):
        table.add_column(column)
    for e in [r["evaluation"] for r in rows if r.get("evaluation")][-last:]:
        seats = " ".join(f"{s}:{v:.2f}" for s, v in e.get("nonloss_by_seat", {}).items())
        table.add_row(fmt(e.get("minute"), 1), str(e.get("tag")), str(e.get("player", "")), str(e.get("opponent")),
                      fmt(e.get("nonloss")), seats, fmt(e.get("win_rate")), fmt(e.get("invalid_rate")))
    return table


def league_table(row: dict) -> Table | None:
    if not row.get("ratings"):
        return None
    table = Table(title=f"league ({row.get('matches', 0)} matches)")
    for column in ("player", "rating (ordinal)", "version"):
        table.add_column(column)
    versions = row.get("versions", {})
    for player, rating in sorted(row["ratings"].items(), key=lambda item: -item[1]):
        table.add_row(player, fmt(rating, 2), fmt(versions.get(player)))
    return table


def render(run_dir: str | Path):
    """One screen of the run's figures (a rich renderable)."""
    run_dir = Path(run_dir)
    rows = read_rows(run_dir)
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    row = rows[-1] if rows else {}
    title = f"tidal top: {run_dir.name} ({run_state(run_dir)}, {len(rows)} metrics rows)"
    if not rows:
        return Panel("no metrics yet: the run is starting", title=title)
    side = Table.grid(padding=(0, 4))
    side.add_row(figures(row, run_dir), Group(actors_table(row, summary), staleness_histogram(row.get("staleness_total"))))
    parts = [side, evaluations_table(rows)]
    league = league_table(row)
    if league is not None:
        parts.append(league)
    return Panel(Group(*parts), title=title)


def find_run(run: str | None, runs_dir: str = "runs") -> Path:
    """``run``, or the most recently changed run under ``runs_dir``."""
    if run:
        path = Path(run).expanduser()
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"{run} is not a run directory (no config.json)")
        return path
    runs = sorted(Path(runs_dir).glob("*/metrics.jsonl"), key=lambda p: p.stat().st_mtime)
    if not runs:
        raise FileNotFoundError(f"no run under {runs_dir}: name one")
    return runs[-1].parent


def watch(run_dir: Path, refresh_s: float = 2.0) -> None:
    """Redraw the run's screen every ``refresh_s`` until the run has finished (or Ctrl-C)."""
    with Live(render(run_dir), refresh_per_second=4, screen=False) as live:
        while True:
            time.sleep(refresh_s)
            live.update(render(run_dir))
            if run_state(run_dir) == "finished":
                return
