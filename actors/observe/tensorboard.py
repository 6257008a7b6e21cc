"""TensorBoard, live: every metrics row the driver writes also goes to TensorBoard event files under
``<run dir>/tensorboard`` (tags as ``figures.py`` names them; the step is the run's elapsed seconds).
``tensorboard --logdir runs/`` then shows every run side by side; a resumed run appends to its own directory."""

from __future__ import annotations

from pathlib import Path

from actors.observe.figures import RowWriter

TENSORBOARD_DIR = "tensorboard"


class TensorBoardLog(RowWriter):
    """Writes metrics rows as TensorBoard events under ``<run_dir>/tensorboard``."""

    name = "tensorboard"

    def __init__(self, run_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        super().__init__()
        self.dir = Path(run_dir) / TENSORBOARD_DIR
        self.writer = SummaryWriter(str(self.dir), flush_secs=5)

    def scalar(self, tag: str, value: float, step: int, walltime) -> None:
        self.writer.add_scalar(tag, value, step, walltime=walltime)

    def histogram(self, tag: str, values: list[tuple[float, int]], binned: bool, step: int, walltime) -> None:
        """Integer values' buckets end half a value above each; bins end at their keys."""
        values = [(k, n) for k, n in values if n > 0]
        total = sum(n for _, n in values)
        self.writer.add_histogram_raw(
            tag, min=values[0][0], max=values[-1][0], num=total, sum=float(sum(k * n for k, n in values)),
            sum_squares=float(sum(k * k * n for k, n in values)),
            bucket_limits=[k if binned else k + 0.5 for k, _ in values], bucket_counts=[n for _, n in values],
            global_step=step, walltime=walltime)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
