"""Weights & Biases, an optional extra (``pip install -e '.[wandb]'``, ``observe.wandb=true``): the same figures
as TensorBoard (``figures.py``), logged to a W&B run. ``observe.wandb_mode`` is ``offline`` by default: the run is
kept under ``<run dir>/wandb`` with no network and no account, and ``wandb sync <run dir>/wandb/offline-run-*``
uploads it later; ``online`` logs as it goes (an API key needed). The W&B run's id comes from the run directory,
so a resumed run goes on in the same W&B run (online; offline, W&B keeps each life in a directory of its own with
that id, and ``wandb sync --append`` puts them one after the other). Its x-axis is ``elapsed_s``, the run's
elapsed seconds, which a resumed run continues."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from actors.observe.figures import RowWriter

MODES = ("offline", "online")


def wandb_run_id(run_dir: Path) -> str:
    """The same id for the same run directory (so a resume continues the run), distinct for distinct ones."""
    path = Path(run_dir).resolve()
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", path.name)[:48]
    return f"{name}-{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"


def histogram_edges(values: list[tuple[float, int]], binned: bool) -> tuple[list[int], list[float]]:
    """Counts and edges for ``wandb.Histogram(np_histogram=...)``: integer values each in a bucket of width one
    (missing ones count zero); bins keyed by upper edges, the first bin's lower edge as far below as the bins
    are spaced (the importance weights' log2 bins: a ratio)."""
    if not binned:
        low, high = int(values[0][0]), int(values[-1][0])
        counts = dict((int(k), n) for k, n in values)
        return [counts.get(k, 0) for k in range(low, high + 1)], [k - 0.5 for k in range(low, high + 2)]
    uppers = [k for k, _ in values]
    if len(uppers) > 1 and uppers[0] > 0:
        first = uppers[0] * uppers[0] / uppers[1]
    else:
        first = uppers[0] - 1.0
    return [n for _, n in values], [first, *uppers]


class WandbLog(RowWriter):
    """Writes metrics rows to a Weights & Biases run, one ``log`` call per row (and per evaluation)."""

    name = "wandb"

    def __init__(self, run_dir: Path, config: dict, project: str = "tidal", mode: str = "offline"):
        if mode not in MODES:
            raise ValueError(f"observe.wandb_mode must be one of {', '.join(MODES)}, not {mode!r}")
        try:
            import wandb
        except ImportError as error:
            raise RuntimeError("observe.wandb=true needs the wandb extra: pip install -e '.[wandb]'") from error
        super().__init__()
        self._wandb = wandb
        self.dir = Path(run_dir)
        self.run = wandb.init(project=project, dir=str(self.dir), mode=mode, id=wandb_run_id(self.dir),
                              name=self.dir.name, config=config, resume="allow" if mode == "online" else None,
                              reinit="create_new",
                              settings=wandb.Settings(silent=True, console="off", x_disable_stats=True))
        self.run.define_metric("elapsed_s")
        self.run.define_metric("*", step_metric="elapsed_s")
        self._pending: dict = {}

    def scalar(self, tag: str, value: float, step: int, walltime) -> None:
        self._pending[tag] = value

    def histogram(self, tag: str, values: list[tuple[float, int]], binned: bool, step: int, walltime) -> None:
        self._pending[tag] = self._wandb.Histogram(np_histogram=histogram_edges(values, binned))

    def row_done(self, step: int, walltime) -> None:
        if self._pending:
            self.run.log({"elapsed_s": step, **self._pending})
            self._pending = {}

    def close(self) -> None:
        """Finish the W&B run and stop W&B's service process: ``finish`` returns before the service has written
        the run's last records to its file; the stop waits for them, so the run's files are whole on return."""
        self.run.finish()
        self._wandb.teardown()
