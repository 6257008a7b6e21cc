"""Replay's spill: every episode it holds, and every batch it sent, on disk, so a restarted replay loses nothing.

Episodes go to an Arrow IPC stream file per replay process (``episodes-<pid>-<ns>.arrows``, one record batch an
episode, flushed before the episode is acknowledged); batches to ``batches.jsonl``, one line per batch (its
number and its episodes' ids), written whole before it is sent (``streams.disk.append_line``: a line a full disk
cut off never runs into the next). A process killed mid-write leaves a cut-off tail:
loading stops at it, and that episode (never acknowledged) or batch (never sent) comes again. A flush survives
the process, not the machine: there is no fsync on this path.

The spill holds what is live, not the run's history: ``compact(cursor)``, once the learner's checkpoint has
consumed the batches up to ``cursor``, drops them and their episodes (an episode file that holds one is written
again without it, or removed; the batch log keeps the later batches). ``state.json`` keeps what the duplicate
check and the run's accounts need of them: the last batch compacted (``through``), the consumed ids as ranges
(`IdSet`: an env actor's ids ``<life>/<actor>-<incarnation>-<n>`` come in runs of n), how many each env actor
delivered, and any id found in two batches. It is swapped in first: a kill halfway through leaves files that
``load`` already skips and the next compaction removes.

A resumed run's replay takes over the previous life's live episodes and batches (``live_after``, with the
checkpoint's cursor in that life) instead of having them generated again; ``state.json`` records it
(``inherited``).
"""

from __future__ import annotations

import bisect
import json
import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from streams.disk import append_line
from streams.schema import OLDER_SCHEMAS, TRAJECTORY_SCHEMA, Columns, upgrade_batch

log = logging.getLogger(__name__)
BATCH_LOG = "batches.jsonl"
STATE = "state.json"
EPISODE_FILES = "episodes-*.arrows"


def episode_life(episode_id: str) -> str:
    """The life of the run that played an episode (``""`` for an id without one)."""
    life, slash, _ = episode_id.partition("/")
    return life if slash else ""


def episode_source(episode_id: str) -> str:
    """The env actor that played an episode: its ids are ``<life>/<actor>-<incarnation>-<n>`` (`EnvActor`)."""
    return episode_id.rpartition("/")[2].rsplit("-", 2)[0]


class IdSet:
    """A set of episode ids, ``<prefix>-<n>`` ones as ranges of n per prefix (others as they are)."""

    def __init__(self, ranges: dict | None = None, other=()):
        self.ranges = {prefix: [list(span) for span in spans] for prefix, spans in (ranges or {}).items()}
        self.other = set(other)

    @staticmethod
    def _split(episode_id: str) -> tuple[str, int] | None:
        prefix, _, n = episode_id.rpartition("-")
        if prefix and n.isascii() and n.isdigit() and str(int(n)) == n:
            return prefix, int(n)
        return None

    def _span(self, prefix: str, n: int) -> int:
        """The index of the last span of ``prefix`` that starts at or before n (-1: none)."""
        return bisect.bisect_right(self.ranges.get(prefix, []), [n, math.inf]) - 1

    def __contains__(self, episode_id: str) -> bool:
        split = self._split(episode_id)
        if split is None:
            return episode_id in self.other
        i = self._span(*split)
        return i >= 0 and self.ranges[split[0]][i][1] >= split[1]

    def add(self, episode_id: str) -> bool:
        """Add an id; False if it was in already."""
        split = self._split(episode_id)
        if split is None:
            new = episode_id not in self.other
            self.other.add(episode_id)
            return new
        prefix, n = split
        i = self._span(prefix, n)
        spans = self.ranges.setdefault(prefix, [])
        if i >= 0 and spans[i][1] >= n:
            return False
        if i >= 0 and spans[i][1] == n - 1:
            spans[i][1] = n
        else:
            i += 1
            spans.insert(i, [n, n])
        if i + 1 < len(spans) and spans[i + 1][0] == n + 1:  # the gap to the next span is closed
            spans[i][1] = spans.pop(i + 1)[1]
        return True

    def __len__(self) -> int:
        return len(self.other) + sum(last - first + 1 for spans in self.ranges.values() for first, last in spans)

    def __iter__(self):
        yield from self.other
        for prefix, spans in self.ranges.items():
            for first, last in spans:
                yield from (f"{prefix}-{n}" for n in range(first, last + 1))

    def to_json(self) -> dict:
        return {"ranges": self.ranges, "other": sorted(self.other)}


@dataclass
class SpillState:
    through: int = 0  # the batches up to this number are compacted: a checkpoint of the learner consumed them
    consumed: IdSet = field(default_factory=IdSet)  # their episodes
    by_source: dict = field(default_factory=dict)  # of those, how many each env actor of this life delivered
    duplicated: int = 0  # ids found in two compacted batches (trained twice): 0 while all is well
    inherited: dict | None = None  # a resumed run's: {"life", "after", "batches", "episodes"} taken over

    def to_json(self) -> dict:
        return {"through": self.through, "consumed": self.consumed.to_json(), "by_source": self.by_source,
                "duplicated": self.duplicated, "inherited": self.inherited}

    @classmethod
    def from_json(cls, data: dict) -> SpillState:
        consumed = data.get("consumed", {})
        return cls(data.get("through", 0), IdSet(consumed.get("ranges"), consumed.get("other", ())),
                   dict(data.get("by_source", {})), data.get("duplicated", 0), data.get("inherited"))


class Spill:
    def __init__(self, directory: str):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.life = self.dir.name  # a run's spill is <run dir>/replay/<life>
        self._file = None
        self._writer = None
        path = self.dir / STATE
        try:
            self.state = SpillState.from_json(json.loads(path.read_text())) if path.exists() else SpillState()
        except (json.JSONDecodeError, AttributeError, TypeError) as error:
            raise ValueError(f"replay spill {path} is not a spill state: {error}") from error

    def remove_partial(self) -> list[Path]:
        """Remove the ``.partial`` files a write cut short (a kill, a full disk) left: never renamed into place, so
        never read, but holding space. Only the spill's writer (a starting replay) calls it."""
        removed = sorted(self.dir.glob("*.partial"))
        for path in removed:
            path.unlink()
            log.warning("%s: removed, a write cut short", path)
        return removed

    def own(self, episode_id: str) -> bool:
        """Whether an episode was played in this spill's life (not taken over from a previous one)."""
        return episode_life(episode_id) in ("", self.life)

    def is_empty(self) -> bool:
        return not (any(self._episode_files()) or (self.dir / BATCH_LOG).exists() or (self.dir / STATE).exists())

    def add_episode(self, episode: pa.Table) -> None:
        if self._writer is None:
            self._file = open(self.dir / f"episodes-{os.getpid()}-{time.time_ns()}.arrows", "wb")
            self._writer = pa.ipc.new_stream(self._file, TRAJECTORY_SCHEMA)
        columns = [column.combine_chunks() for column in episode.columns]
        self._writer.write_batch(pa.RecordBatch.from_arrays(columns, schema=TRAJECTORY_SCHEMA))
        self._file.flush()

    def add_batch(self, seq: int, episode_ids: list[str]) -> None:
        """Log batch ``seq`` as one whole line: a line a full disk cut off is removed first (`append_line`), so
        that it cannot swallow this one."""
        append_line(self.dir / BATCH_LOG, json.dumps({"seq": seq, "episodes": episode_ids}))

    def load(self, wanted: set[str] | None = None) -> tuple[dict[str, pa.Table], dict[int, list[str]]]:
        """Every live episode on disk (or those ``wanted``), by id in the order they came, and the live batches."""
        episodes: dict[str, pa.Table] = {}
        for path in self._episode_files():
            for batch in _read_batches(path):
                episode_id = _episode_id(batch)
                if episode_id not in self.state.consumed and (wanted is None or episode_id in wanted):
                    episodes.setdefault(episode_id, pa.Table.from_batches([batch]))
        return episodes, self.batches()

    def batches(self) -> dict[int, list[str]]:
        """The logged batches not compacted, by number."""
        path, batches = self.dir / BATCH_LOG, {}
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:  # the last line of a killed replay: that batch was never sent
                    log.warning("%s: a cut-off line skipped", path)
                    continue
                if entry["seq"] > self.state.through:
                    batches[entry["seq"]] = entry["episodes"]
        return batches

    def batches_after(self, seq: int) -> list[tuple[int, pa.Table]]:
        """The logged batches numbered above ``seq``, in order, each as the table that was sent."""
        if seq < self.state.through:
            raise RuntimeError(f"replay spill {self.dir}: the batches up to {self.state.through} were compacted (a "
                               f"checkpoint of the learner had consumed them): those after {seq} cannot be sent again")
        later = {n: ids for n, ids in self.batches().items() if n > seq}
        episodes, _ = self.load({i for ids in later.values() for i in ids})
        missing = [i for ids in later.values() for i in ids if i not in episodes]
        if missing:
            raise RuntimeError(f"replay spill {self.dir}: batches name episodes not on disk: {missing[:5]}")
        return [(n, pa.concat_tables([episodes[i] for i in later[n]])) for n in sorted(later)]

    def live_after(self, cursor: int) -> tuple[dict[str, pa.Table], list[list[str]]]:
        """What a resumed run takes over from this spill of a previous life whose learner's checkpoint consumed the
        batches up to ``cursor``: the episodes none of those took (by id, in order), and the later batches' ids."""
        episodes, batches = self.load()
        if cursor < self.state.through:
            log.warning("%s: compacted through batch %d, beyond the checkpoint's %d", self.dir, self.state.through,
                        cursor)
        done = {i for n, ids in batches.items() if n <= cursor for i in ids}
        return ({i: e for i, e in episodes.items() if i not in done},
                [batches[n] for n in sorted(batches) if n > cursor])

    def mark_inherited(self, inherited: dict) -> None:
        self.state.inherited = inherited
        self._write_state(self.state)

    def compact(self, cursor: int) -> list[str]:
        """Drop the batches up to ``cursor`` (a checkpoint of the learner consumed them) and their episodes; the ids
        of those episodes go to the state's ``consumed``. Returns them."""
        if cursor <= self.state.through:
            return []
        old = self.state
        state = SpillState(cursor, IdSet(old.consumed.ranges, old.consumed.other), dict(old.by_source),
                           old.duplicated, old.inherited)
        moved = []
        for seq, ids in sorted(self.batches().items()):
            if seq > cursor:
                break
            for episode_id in ids:
                if not state.consumed.add(episode_id):
                    state.duplicated += 1
                    continue
                moved.append(episode_id)
                if self.own(episode_id):
                    source = episode_source(episode_id)
                    state.by_source[source] = state.by_source.get(source, 0) + 1
        self._write_state(state)  # first: from here on load() skips what goes
        self.state = state
        self.close()  # later episodes go to a new file
        self._rewrite_episode_files()
        self._rewrite(self.dir / BATCH_LOG, [json.dumps({"seq": n, "episodes": ids}) + "\n"
                                             for n, ids in sorted(self.batches().items())])
        return moved

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._file.close()
            self._writer = self._file = None

    def _episode_files(self) -> list[Path]:
        return sorted(self.dir.glob(EPISODE_FILES), key=lambda p: p.stat().st_mtime_ns)

    def _rewrite_episode_files(self) -> None:
        """Each episode file that holds a consumed episode, written again without it (and with its time, so that
        loading keeps the order they came in), or removed."""
        for path in self._episode_files():
            batches = list(_read_batches(path))
            keep = [batch for batch in batches if _episode_id(batch) not in self.state.consumed]
            if len(keep) == len(batches):
                continue
            if keep:
                fresh = self.dir / f"episodes-{os.getpid()}-{time.time_ns()}.arrows"
                partial = fresh.with_suffix(".partial")
                with open(partial, "wb") as f, pa.ipc.new_stream(f, TRAJECTORY_SCHEMA) as writer:
                    for batch in keep:
                        writer.write_batch(batch)
                stat = path.stat()
                os.utime(partial, ns=(stat.st_atime_ns, stat.st_mtime_ns))
                partial.rename(fresh)
            path.unlink()

    def _write_state(self, state: SpillState) -> None:
        self._rewrite(self.dir / STATE, [json.dumps(state.to_json())])

    @staticmethod
    def _rewrite(path: Path, lines: list[str]) -> None:
        """Replace ``path`` whole: a kill leaves the old file or the new one."""
        partial = path.with_name(path.name + ".partial")
        partial.write_text("".join(lines))
        partial.replace(path)


def previous_life(spill_dir: str | Path) -> Path | None:
    """The spill of the run's life before ``spill_dir``'s (lives are named by their start time), or None."""
    here = Path(spill_dir)
    if not here.parent.exists():
        return None
    before = sorted(p for p in here.parent.iterdir() if p.is_dir() and p.name < here.name)
    return before[-1] if before else None


def _episode_id(batch: pa.RecordBatch) -> str:
    """The episode's id: its first row's, or the first a row has (a record spilled before replay checked every row
    may hold a null id; its rows are refused as it is reloaded, the others kept)."""
    return next((i for i in batch.column(Columns.EPISODE_ID).to_pylist() if i), "")


def _read_batches(path: Path):
    """The record batches of a spill file (Arrow IPC: data, nothing in it is executed); a file whose schema is not
    the trajectory schema is not replay's and is skipped, with a warning."""
    with open(path, "rb") as f:
        try:
            reader = pa.ipc.open_stream(f)
            upgrade = any(reader.schema.equals(old) for old in OLDER_SCHEMAS)  # columns it lacks: their defaults
            if not (upgrade or reader.schema.equals(TRAJECTORY_SCHEMA)):
                log.warning("%s: skipped: its schema is not the trajectory schema", path)
                return
            while True:
                batch = reader.read_next_batch()
                yield upgrade_batch(batch) if upgrade else batch
        except StopIteration:
            return
        except (pa.ArrowInvalid, OSError) as error:  # a tail cut off by a kill: what came before is whole
            log.warning("%s: stops at a cut-off record (%s)", path, error)


def account_episodes(run_dir: str | Path, life: str, consumed_batches: int) -> dict:
    """Every training episode of a run's ``life`` by id: produced (the env actors' ledgers: delivered to
    reward), consumed (in the batches the learner trained, up to ``consumed_batches``, compacted ones included),
    still held by replay, dropped (unscored or refused on the way, and given back to admission: the env actors'
    ``*.dropped`` ledgers), lost (produced and nowhere), duplicated (trained more than once) and inherited (taken
    over from the previous life of a resumed run, so in no ledger of this one)."""
    run_dir = Path(run_dir)
    produced: set[str] = set()
    for path in (run_dir / "ledger" / life).glob("*.txt"):
        produced.update(line for line in path.read_text().splitlines() if line)
    dropped: set[str] = set()
    for path in (run_dir / "ledger" / life).glob("*.dropped"):
        dropped.update(line.split()[0] for line in path.read_text().splitlines() if line.strip())
    spill = Spill(str(run_dir / "replay" / life))
    held, batches = spill.load()
    trained = [i for seq, ids in batches.items() if seq <= consumed_batches for i in ids]
    compacted = set(spill.state.consumed)
    consumed = set(trained) | compacted
    duplicated = spill.state.duplicated + len(trained) - len(set(trained)) + len(set(trained) & compacted)
    kept = set(held) | consumed
    inherited = {i for i in kept if not spill.own(i)}
    return {"produced": len(produced), "consumed": len(consumed), "held": len(set(held) - consumed),
            "dropped": len(produced & dropped - consumed - set(held)),
            "lost": len(produced - set(held) - consumed - dropped), "duplicated": duplicated,
            "unledgered": len(kept - produced - inherited),  # delivered by an env killed before it wrote
            "inherited": len(inherited)}
