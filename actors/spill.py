"""Replay's spill: every episode it holds, and every batch it sent, on disk, so a restarted replay loses nothing.

Episodes go to an Arrow IPC stream file per replay process (``episodes-<pid>-<ns>.arrows``, one record batch an
episode, flushed before the episode is acknowledged); batches to ``batches.jsonl``, one line per batch (its
number and its episodes' ids), flushed before it is sent. A process killed mid-write leaves a cut-off tail:
loading stops at it, and that episode (never acknowledged) or batch (never sent) comes again. A flush survives
the process, not the machine: there is no fsync on this path.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import pyarrow as pa

from streams.schema import TRAJECTORY_SCHEMA, Columns

log = logging.getLogger(__name__)
BATCH_LOG = "batches.jsonl"


def episode_source(episode_id: str) -> str:
    """The env actor that played an episode: its ids are ``<actor>-<incarnation>-<n>`` (`EnvActor`)."""
    return episode_id.rsplit("-", 2)[0]


class Spill:
    def __init__(self, directory: str):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._file = None
        self._writer = None

    def add_episode(self, episode: pa.Table) -> None:
        if self._writer is None:
            self._file = open(self.dir / f"episodes-{os.getpid()}-{time.time_ns()}.arrows", "wb")
            self._writer = pa.ipc.new_stream(self._file, TRAJECTORY_SCHEMA)
        columns = [column.combine_chunks() for column in episode.columns]
        self._writer.write_batch(pa.RecordBatch.from_arrays(columns, schema=TRAJECTORY_SCHEMA))
        self._file.flush()

    def add_batch(self, seq: int, episode_ids: list[str]) -> None:
        with open(self.dir / BATCH_LOG, "a") as f:
            f.write(json.dumps({"seq": seq, "episodes": episode_ids}) + "\n")

    def load(self, wanted: set[str] | None = None) -> tuple[dict[str, pa.Table], dict[int, list[str]]]:
        """Every episode on disk (or those ``wanted``), by id in the order they came, and the logged batches."""
        episodes: dict[str, pa.Table] = {}
        for path in sorted(self.dir.glob("episodes-*.arrows"), key=lambda p: p.stat().st_mtime):
            for batch in _read_batches(path):
                episode_id = batch.column(Columns.EPISODE_ID)[0].as_py()
                if wanted is None or episode_id in wanted:
                    episodes.setdefault(episode_id, pa.Table.from_batches([batch]))
        return episodes, self.batches()

    def batches(self) -> dict[int, list[str]]:
        path, batches = self.dir / BATCH_LOG, {}
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:  # the last line of a killed replay: that batch was never sent
                    log.warning("%s: a cut-off line skipped", path)
                    continue
                batches[entry["seq"]] = entry["episodes"]
        return batches

    def batches_after(self, seq: int) -> list[tuple[int, pa.Table]]:
        """The logged batches numbered above ``seq``, in order, each as the table that was sent."""
        later = {n: ids for n, ids in self.batches().items() if n > seq}
        episodes, _ = self.load({i for ids in later.values() for i in ids})
        missing = [i for ids in later.values() for i in ids if i not in episodes]
        if missing:
            raise RuntimeError(f"replay spill {self.dir}: batches name episodes not on disk: {missing[:5]}")
        return [(n, pa.concat_tables([episodes[i] for i in later[n]])) for n in sorted(later)]


def _read_batches(path: Path):
    """The record batches of a spill file (Arrow IPC: data, nothing in it is executed); a file whose schema is not
    the trajectory schema is not replay's and is skipped, with a warning."""
    with open(path, "rb") as f:
        try:
            reader = pa.ipc.open_stream(f)
            if not reader.schema.equals(TRAJECTORY_SCHEMA):
                log.warning("%s: skipped: its schema is not the trajectory schema", path)
                return
            while True:
                yield reader.read_next_batch()
        except StopIteration:
            return
        except (pa.ArrowInvalid, OSError) as error:  # a tail cut off by a kill: what came before is whole
            log.warning("%s: stops at a cut-off record (%s)", path, error)


def account_episodes(run_dir: str | Path, life: str, consumed_batches: int) -> dict:
    """Every training episode of a run's ``life`` by id: produced (the env actors' ledgers: delivered to
    reward), consumed (in the batches the learner trained, up to ``consumed_batches``), still held by replay,
    lost (produced and nowhere) and duplicated (trained more than once)."""
    run_dir = Path(run_dir)
    produced: set[str] = set()
    for path in (run_dir / "ledger" / life).glob("*.txt"):
        produced.update(line for line in path.read_text().splitlines() if line)
    spill = Spill(str(run_dir / "replay" / life))
    held, batches = spill.load()
    trained = [i for seq, ids in batches.items() if seq <= consumed_batches for i in ids]
    consumed = set(trained)
    return {"produced": len(produced), "consumed": len(consumed), "held": len(set(held) - consumed),
            "lost": len(produced - set(held) - consumed), "duplicated": len(trained) - len(consumed),
            "unledgered": len((set(held) | consumed) - produced)}  # delivered by an env killed before it wrote
