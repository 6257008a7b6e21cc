"""``tidal top [run]``: a live terminal dashboard of a running or finished run.

It reads what the run writes (``metrics.jsonl``, ``summary.json``, ``control.json`` while it runs, the episode
dataset's files) and needs no Ray: versions and rates, the learner's busy and the rollout actors' idle fractions,
queues, a histogram of the staleness of every token trained so far, actors per kind with their restarts, scaling
events, the last evaluations and, in a league, its ratings.

What it reads is data, whoever wrote it: every value is shown as plain text (``cell``: no rich markup, control
characters removed, so no escape sequence reaches the terminal), and a row or a field of the wrong shape is shown
as missing, never an error.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from rich.console import Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from actors.learner.dataset import DATASET_DIR
from actors.runs.control import CONTROL_FILE

BAR_WIDTH = 40
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # C0 and C1 control characters: ESC, BEL, CSI, OSC, ...


def read_rows(run_dir: Path) -> list[dict]:
    """The run's metrics rows (a cut-off last line, being written, is left for the next look)."""
    path = run_dir / "metrics.jsonl"
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict):  # anything else is not a metrics row
                rows.append(row)
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


def cell(value, digits: int = 3) -> Text:
    """``value`` as it is shown: plain text (rich would read a string as markup), no control character."""
    return Text(CONTROL.sub("", fmt(value, digits)))


def mapping(value) -> dict:
    """``value`` if it is a dict (a field of a row that may have been written by anyone), else empty."""
    return value if isinstance(value, dict) else {}


def number(value, default: float = 0.0) -> float:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else default


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
            value = fmt(number(row.get("elapsed_s")) / 60, 1)
        elif label.startswith("staleness"):
            value = f"{fmt(row.get('staleness_mean'), 2)} / {fmt(row.get('staleness_max'))}"
        else:
            value = fmt(row.get(key))
        table.add_row(label, cell(value))
    table.add_row("dataset batches", str(len(dataset)))
    return table


def actors_table(row: dict, summary: dict) -> Table:
    table = Table(title="actors")
    for column in ("kind", "count", "restarts"):
        table.add_column(column)
    restarts = mapping(row.get("restarts_by_actor")) or mapping(summary.get("restarts"))
    for kind, count in (("rollout", row.get("rollout_actors")), ("env", row.get("env_actors")),
                        ("learner", 1), ("replay", 1), ("reward", 1)):
        table.add_row(kind, cell(count), cell(sum(number(n) for name, n in restarts.items()
                                                  if str(name).startswith(kind))))
    table.add_row("all", "", cell(f"{fmt(row.get('restarts', 0))} (scale events: {fmt(row.get('scale_events', 0))})"))
    table.add_row("faults", "", cell(f"rejected {fmt(row.get('rejected_episodes', 0))} episodes, reissued "
                                     f"{fmt(row.get('reissued_requests', 0))}, duplicates "
                                     f"{fmt(row.get('duplicate_completions', 0))}, dropped frames "
                                     f"{fmt(row.get('dropped_frames', 0))}"))
    return table


def staleness_histogram(counts: dict) -> Table:
    """Every token trained so far, by its staleness (versions behind the learner)."""
    table = Table(title="staleness of trained tokens", show_header=False, box=None)
    values = sorted((int(k), int(n)) for k, n in mapping(counts).items()
                    if str(k).lstrip("-").isdigit() and isinstance(n, int) and not isinstance(n, bool))
    total = sum(n for _, n in values) or 1
    top = max((n for _, n in values), default=1) or 1
    for staleness, n in values:
        table.add_row(str(staleness), "█" * max(round(BAR_WIDTH * n / top), 1 if n else 0), f"{n / total:.1%}")
    return table


def evaluations_table(rows: list[dict], last: int = 6) -> Table:
    table = Table(title="last evaluations")
    for column in ("minute", "tag", "player", "opponent", "non-loss", "by seat", "wins", "invalid"):
        table.add_column(column)
    for e in [mapping(r.get("evaluation")) for r in rows if mapping(r.get("evaluation"))][-last:]:
        seats = " ".join(f"{s}:{fmt(v, 2)}" for s, v in mapping(e.get("nonloss_by_seat")).items())
        table.add_row(cell(e.get("minute"), 1), cell(e.get("tag")), cell(e.get("player", "")), cell(e.get("opponent")),
                      cell(e.get("nonloss")), cell(seats), cell(e.get("win_rate")), cell(e.get("invalid_rate")))
    return table


def league_table(row: dict) -> Table | None:
    ratings = mapping(row.get("ratings"))
    if not ratings:
        return None
    table = Table(title=cell(f"league ({fmt(row.get('matches', 0))} matches)"))
    for column in ("player", "rating (ordinal)", "version"):
        table.add_column(column)
    versions = mapping(row.get("versions"))
    for player, rating in sorted(ratings.items(), key=lambda item: -number(item[1])):
        table.add_row(cell(player), cell(rating, 2), cell(versions.get(player)))
    return table


def render(run_dir: str | Path):
    """One screen of the run's figures (a rich renderable)."""
    run_dir = Path(run_dir)
    rows = read_rows(run_dir)
    summary_path = run_dir / "summary.json"
    try:
        summary = mapping(json.loads(summary_path.read_text())) if summary_path.exists() else {}
    except json.JSONDecodeError:
        summary = {}
    row = rows[-1] if rows else {}
    title = cell(f"tidal top: {run_dir.name} ({run_state(run_dir)}, {len(rows)} metrics rows)")
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
