"""Every trained episode as a Parquet dataset: ``<run dir>/episodes/<life>/<member>/batch-<seq>.parquet``.

The learner is the one place that knows an episode was trained: it hands each batch it trained (the rows left
after the staleness bound) to an ``EpisodeDataset``, whose thread writes it as one Parquet file named by the
batch's number in the life (``life``, ``member``, ``batch_seq`` and ``trained_version`` are columns of every row,
beside the trajectory schema's and the decoded ``prompt_text``). The learner's critical path only puts the table
on a queue.

Exactly once, across restarts and lives: a file is written whole (``.partial`` renamed), and a batch trained
again after a restart has the same number and rows, so it replaces its file. ``flush`` waits until every batch
handed over is on disk; the learner flushes before each checkpoint, so the checkpoint's data cursor ``n`` implies
the files up to ``n``. A (re)starting learner calls ``prune(life, n)`` with its checkpoint's cursor: the files of
that life after ``n`` were trained by a learner whose updates were lost, and their episodes will be trained
again (in this life, or, for a resumed run, in its new life, where replay took them over).

The dataset is for looking at, not for training: a write that fails (a full disk, a directory made read-only)
turns it off, said loudly once in the log and counted in the learner's statistics (``dataset.failed``), and the
learner trains on. Its files then end at the last batch written; the run's checkpoints and spill are untouched
(they meet the disk on their own). A starting dataset removes the ``.partial`` files a cut-short write left.
"""

from __future__ import annotations

import logging
import queue
import re
import threading
import time
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.parquet as pq

from streams.schema import Columns

log = logging.getLogger(__name__)
DATASET_DIR = "episodes"
FILE = re.compile(r"batch-(\d+)\.parquet$")


def batch_file(root: Path, life: str, member: str, seq: int) -> Path:
    return Path(root) / life / member / f"batch-{seq:08d}.parquet"


def batch_table(table: pa.Table, life: str, member: str, seq: int, version: int | None,
                decode: Callable[[list], list[str]] | None = None) -> pa.Table:
    """A trained batch's rows as the dataset keeps them: the trajectory columns and where and when it trained."""
    n = table.num_rows
    extra = {"life": pa.array([life] * n, pa.string()), "member": pa.array([member] * n, pa.string()),
             "batch_seq": pa.array([seq] * n, pa.int64()), "trained_version": pa.array([version] * n, pa.int64())}
    if decode is not None:
        extra["prompt_text"] = pa.array(decode(table.column(Columns.PROMPT_IDS).to_pylist()), pa.string())
    for name, column in extra.items():
        table = table.append_column(name, column)
    return table


def write_batch(root: Path, table: pa.Table, life: str, member: str, seq: int) -> Path:
    """One batch's file, written whole: a reader sees the old file or the new one, never half of one."""
    path = batch_file(root, life, member, seq)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    pq.write_table(table, partial, compression="zstd")
    partial.replace(path)
    return path


class EpisodeDataset:
    """The trained batches of one member in one life, written by a thread of its own."""

    def __init__(self, root: str | Path, life: str, member: str, decode: Callable[[list], list[str]] | None = None):
        self.root, self.life, self.member, self.decode = Path(root), life, member, decode
        self._queue: queue.Queue = queue.Queue()
        self._error: BaseException | None = None  # the write that failed: the dataset is off from there on
        self.written = {"batches": 0, "rows": 0, "cpu_s": 0.0, "failed": 0}  # cpu_s: the thread's own CPU time;
        # failed: 1 once a write failed (the dataset turned off)
        self._thread = threading.Thread(target=self._write_all, name=f"dataset-{member}", daemon=True)
        self._thread.start()

    @classmethod
    def opened(cls, learner_cfg, checkpoint_cursor: dict, decode=None) -> EpisodeDataset:
        """A learner's dataset (its ``dataset_dir``, ``data_life`` and ``policy_id``), less the files trained past
        the checkpoint it starts from (``checkpoint_cursor``: its life and number; none: this life's files)."""
        life = learner_cfg.data_life
        dataset = cls(learner_cfg.dataset_dir, life, learner_cfg.policy_id, decode)
        for partial in Path(learner_cfg.dataset_dir).glob(f"*/{learner_cfg.policy_id}/*.partial"):
            partial.unlink()  # a write cut short (a kill, a full disk): never renamed into place
        trained_in = checkpoint_cursor.get("life", life)
        dataset.prune(trained_in, checkpoint_cursor.get("seq", 0))
        if trained_in != life:  # a checkpoint of a previous life: nothing of this one is in it
            dataset.prune(life, 0)
        return dataset

    @property
    def off(self) -> bool:
        return self._error is not None

    def add(self, table: pa.Table, seq: int, version: int) -> None:
        """Batch ``seq``, trained at ``version``: written soon, on the dataset's thread (dropped once it is off)."""
        if not self.off:
            self._queue.put((table, seq, version))

    def flush(self) -> None:
        """Wait until every batch added so far is written, or dropped: a failed write turns the dataset off, and a
        checkpoint or a stop never waits on the dataset's disk."""
        self._queue.join()

    def close(self) -> None:
        self.flush()
        self._queue.put(None)
        self._thread.join()

    def prune(self, life: str, cursor: int) -> list[Path]:
        """Remove this member's files of ``life`` numbered after ``cursor`` (trained past the checkpoint)."""
        removed = []
        for path in sorted((self.root / life / self.member).glob("batch-*.parquet")):
            if int(FILE.search(path.name).group(1)) > cursor:
                path.unlink()
                removed.append(path)
        if removed:
            log.info("episode dataset: %d batches of life %s after batch %d removed (trained again)", len(removed),
                     life, cursor)
        return removed

    def _write_all(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                if self.off:
                    continue
                table, seq, version = item
                started = time.thread_time()
                rows = batch_table(table, self.life, self.member, seq, version, self.decode)
                write_batch(self.root, rows, self.life, self.member, seq)
                self.written["batches"] += 1
                self.written["rows"] += rows.num_rows
                self.written["cpu_s"] += time.thread_time() - started
            except Exception as error:  # the dataset goes off, loudly; training goes on
                log.exception("episode dataset under %s: batch %d not written: the dataset is turned off for the "
                              "rest of this learner's life (training goes on; its files end at batch %d)", self.root,
                              item[1], item[1] - 1)
                self._error = error
                self.written["failed"] = 1
            finally:
                self._queue.task_done()
