"""``tidal export <run>``: the episode dataset (``actors/learner/dataset.py``) of a run made without it, from its spill.

Replay's spill (``actors/replay/spill.py``) logs every batch it sent and keeps, per life, the episodes no checkpoint of
the learner has consumed yet; it compacts the rest away as checkpoints come (their ids stay in ``state.json``,
their rows do not). The export writes each logged batch the learner's checkpoint consumed (numbered up to its
cursor in that life: for an earlier life of a resumed run, the cursor the next life took over after) as the
dataset's file of that life, member and number. What it cannot write it counts: the episodes compacted before
the export (``compacted``) and batches naming an episode no longer on disk (``incomplete_batches``). Unlike the
live dataset it cannot know the trained version or the turns the staleness bound dropped: ``trained_version``
is null and every row of a batch is there.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

from actors.learner.dataset import DATASET_DIR, batch_table, write_batch
from actors.models.checkpoints import checkpoint_cursor
from actors.replay.spill import Spill
from streams.disk import name_problem


def member_dirs(run_dir: Path) -> list[tuple[str, Path, Path]]:
    """Each learning member of a run: (id, its spill's root, its checkpoint directory)."""
    saved = json.loads((run_dir / "config.json").read_text())
    ids = [m["id"] for m in saved["league"]["members"]] if saved.get("league") else [saved["run"].get("policy_id", "main")]
    problems = [p for i in ids if (p := name_problem("member id", i))]
    if problems:  # each names directories the export reads and writes
        raise ValueError(f"{run_dir}/config.json: {'; '.join(problems)}")
    if saved.get("league"):
        return [(i, run_dir / "replay" / i, run_dir / "members" / i / "policy") for i in ids]
    return [(ids[0], run_dir / "replay", run_dir / "policy")]


def decoder(policy: Path):
    """The run's tokenizer's decode (from its checkpoint), or None where it has none."""
    if not (policy / "tokenizer_config.json").exists():
        return None
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(policy)
    return lambda ids: tokenizer.batch_decode(ids)


def export_run(run_dir: str | Path, out: str | Path | None = None) -> dict:
    """Write the run's trained batches from its spill as the episode dataset under ``out`` (default: the run's
    ``episodes/``, which must not hold a dataset yet); returns what was written and what could not be."""
    run_dir = Path(run_dir).expanduser()
    if not (run_dir / "config.json").exists():
        raise FileNotFoundError(f"{run_dir} is not a run directory (no config.json)")
    out = Path(out) if out else run_dir / DATASET_DIR
    if any(out.glob("*/*/batch-*.parquet")):
        raise FileExistsError(f"{out} holds a dataset already: name another directory with --out")
    counts = {"batches": 0, "episodes": 0, "compacted": 0, "incomplete_batches": 0, "dir": str(out)}
    for member, spill_root, policy in member_dirs(run_dir):
        lives = sorted(p for p in spill_root.iterdir() if p.is_dir()) if spill_root.exists() else []
        decode = decoder(policy)
        for i, life_dir in enumerate(lives):
            cursor = trained_through(life_dir, lives[i + 1] if i + 1 < len(lives) else None, policy)
            spill = Spill(str(life_dir))
            episodes, batches = spill.load()
            counts["compacted"] += len(spill.state.consumed)
            for seq, ids in sorted(batches.items()):
                if cursor is not None and seq > cursor:
                    continue
                if not all(i in episodes for i in ids):
                    counts["incomplete_batches"] += 1
                    continue
                table = pa.concat_tables([episodes[i] for i in ids])
                write_batch(out, batch_table(table, life_dir.name, member, seq, None, decode), life_dir.name,
                            member, seq)
                counts["batches"] += 1
                counts["episodes"] += len(ids)
    return counts


def trained_through(life_dir: Path, next_life: Path | None, policy: Path) -> int | None:
    """The last batch of ``life_dir``'s life that the learner's checkpoint consumed: the checkpoint's cursor for
    the last life; for an earlier one, the cursor its successor took over after (None: unknown, all logged)."""
    if next_life is None:
        return checkpoint_cursor(policy, life_dir.name)
    inherited = Spill(str(next_life)).state.inherited or {}
    return inherited.get("after") if inherited.get("life") == life_dir.name else None
