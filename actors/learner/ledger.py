"""The learner's ledger: per version, what made it, so that ``tidal replay`` can run the learner again, exactly.

An asynchronous run cannot be run twice: which episode lands in which batch, how stale each token is and which
version sampled it depend on timing. What the learner did with what it got can be: its updates are deterministic
on a CPU given their inputs. The episode dataset (``actors/learner/dataset.py``) keeps each trained batch; the
ledger keeps the rest, one JSON line per event, in ``<run dir>/episodes/_ledger/<member>.jsonl``:

- ``start``: the learner (re)started at ``version``, from the base model or a checkpoint (``from``); a restart
  holds no guard anchors (they are not checkpointed). ``code`` fingerprints the code that trains (``tidal replay``
  refuses a run recorded by other code), ``model_path`` names the base model.
- ``update``: the batch that made ``version`` (``batch``: the dataset's life, member and number), its rows, the
  turns the staleness bound dropped from it (``dropped``), the bound in force (``eta``) and the next one
  (``eta_next``), the learning rate (``lr``: decay and guard scale in it), the seed the update drew from
  (``seed``), the newest token version it accepted (``max_version``), the guard's move (``guard``: trips, a
  rollback, an anchor kept) and the learner's busy seconds (``train_s``).
- ``reset``: a league exploiter's reset to the base model made ``version``.
- ``dropped_batch``: a batch every turn of which was past the bound: consumed, no update.

Every entry that leaves weights (``start``, ``update``, ``reset``) carries their digest: a BLAKE2b of each
tensor's dtype, shape and bytes (``digest``: name -> 16 hex digits, the first difference names its tensor) and
one over them all (``weights``). Digests are taken from the CPU copy the weights publisher serialises anyway.

Exactly once, like the dataset: lines are appended whole (``streams.disk.append_line``) before the checkpoint
that covers them, and a (re)starting learner cuts the ledger back to its checkpoint (``Ledger.opened``): an entry
past the checkpoint's version (or a dropped batch past its data cursor) describes work that was lost and will be
done again. A write that fails turns the ledger off (said once, loudly; the learner trains on): the ledger then
ends there, and a replay stops there, naming the version.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path

import torch

from streams.disk import append_line

log = logging.getLogger(__name__)
LEDGER_DIR = "_ledger"  # under the dataset's root; "_": Parquet readers of the directory skip it
FORMAT = 1
KINDS = ("start", "update", "reset", "dropped_batch")
WEIGHT_KINDS = ("start", "update", "reset")
_HEX = re.compile(r"^[0-9a-f]{16}$")
# The code an update runs (a replay's fingerprint): the maths, the trainer, how a batch is read and checked, how a
# model is loaded and placed. Not the actors around it, nor the ledger or the replay themselves: what they decide
# (drops, guard moves, learning rates) is recorded.
CODE_DIRS = ("algos",)
CODE_FILES = tuple(f"actors/learner/{name}.py" for name in ("trainer", "update", "batch", "microbatches", "group")) + (
    "actors/models/base_model.py", "actors/models/devices.py", "actors/models/padding.py", "streams/schema.py",
    "streams/values.py")


class LedgerError(ValueError):
    """The ledger cannot be read as a history of the learner: names the line and what is wrong with it."""


def ledger_path(dataset_dir: str | Path, member: str) -> Path:
    return Path(dataset_dir) / LEDGER_DIR / f"{member}.jsonl"


def tensor_digest(tensor: torch.Tensor) -> str:
    """16 hex digits over the tensor's dtype, shape and bytes (any device; copied to the CPU if need be)."""
    data = tensor.detach().to("cpu").contiguous()
    digest = hashlib.blake2b(f"{data.dtype}{tuple(data.shape)}".encode(), digest_size=8)
    digest.update(data.reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def weights_digest(state: dict[str, torch.Tensor]) -> dict[str, str]:
    """Each tensor's digest, by name, in the state's order."""
    return {name: tensor_digest(tensor) for name, tensor in state.items()}


def combined(digests: dict[str, str]) -> str:
    """One digest over every tensor's (name and digest, in name order)."""
    joined = "".join(f"{name}={digests[name]};" for name in sorted(digests))
    return hashlib.blake2b(joined.encode(), digest_size=8).hexdigest()


def first_difference(recorded: dict[str, str], replayed: dict[str, str]) -> str | None:
    """The first tensor (in the recorded order) whose digest differs, or that one side lacks; None if none."""
    for name, digest in recorded.items():
        if replayed.get(name) != digest:
            return name
    return next((name for name in replayed if name not in recorded), None)


def code_fingerprint(root: Path | None = None) -> str:
    """A digest of the code an update runs (``CODE_DIRS``, ``CODE_FILES``) and torch's version: equal
    fingerprints run the same update."""
    root = root or Path(__file__).resolve().parents[2]
    digest = hashlib.blake2b(torch.__version__.encode(), digest_size=8)
    paths = [p for d in CODE_DIRS for p in sorted((root / d).rglob("*.py"))] + [root / f for f in CODE_FILES]
    for path in paths:
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


class Ledger:
    """A learner's ledger, appended line by line; off (and said so) after a write that failed."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.off = False

    @classmethod
    def opened(cls, path: str | Path, version: int, cursor: dict | None = None) -> Ledger:
        """The ledger at ``path`` cut back to a learner starting at ``version`` with data ``cursor`` (its
        checkpoint's ``{"life", "seq"}``; none: no batch consumed): every entry after them removed."""
        ledger = cls(path)
        ledger.path.parent.mkdir(parents=True, exist_ok=True)
        if ledger.path.exists():
            lines = ledger.path.read_text().splitlines(keepends=True)
            kept = []
            for line in lines:
                try:
                    entry = json.loads(line)
                except ValueError:
                    break  # a line cut short by a kill: it and whatever follows were not acknowledged
                if not line.endswith("\n") or not _covered(entry, version, cursor or {}):
                    break
                kept.append(line)
            if len(kept) < len(lines):
                log.info("ledger %s: %d entries after version %d removed (trained again)", ledger.path,
                         len(lines) - len(kept), version)
                partial = ledger.path.with_name(ledger.path.name + ".partial")
                partial.write_text("".join(kept))
                os.replace(partial, ledger.path)
        return ledger

    def append(self, entry: dict) -> None:
        if self.off:
            return
        try:
            append_line(self.path, json.dumps(entry, separators=(",", ":")))
        except (OSError, ValueError, TypeError):
            log.exception("ledger %s: an entry of version %s not written: the ledger is off for the rest of this "
                          "learner's life (training goes on; a replay stops at this version)", self.path,
                          entry.get("version"))
            self.off = True


def _covered(entry: dict, version: int, cursor: dict) -> bool:
    """Is ``entry`` part of the history a learner restarting at ``version`` and data ``cursor`` has behind it?"""
    if not isinstance(entry, dict) or not isinstance(entry.get("version"), int):
        return False
    if entry["version"] != version:
        return entry["version"] < version
    if entry.get("kind") != "dropped_batch":
        return True
    batch = entry.get("batch") or {}
    return batch.get("life") == cursor.get("life") and batch.get("seq", 1 << 62) <= cursor.get("seq", 0)


def read_ledger(path: str | Path) -> list[dict]:
    """Every entry of the ledger at ``path``, checked (``LedgerError`` naming the first bad line). A last line cut
    short (a learner killed mid-write) is left out: it was never acknowledged."""
    path = Path(path)
    lines = path.read_text().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    elif lines:
        lines.pop()  # no newline after it: cut short
    entries, version = [], None
    for number, line in enumerate(lines, start=1):
        try:
            entry = json.loads(line)
        except ValueError as error:
            raise LedgerError(f"{path}:{number}: not a JSON line ({error})") from None
        problem = _entry_problem(entry, version)
        if problem:
            raise LedgerError(f"{path}:{number}: {problem}")
        version = entry["version"]
        entries.append(entry)
    if entries and entries[0]["kind"] != "start":
        raise LedgerError(f"{path}:1: the ledger does not begin with the learner's start")
    return entries


def _entry_problem(entry, version: int | None) -> str:
    """What makes ``entry`` no entry after one at ``version`` ("" if nothing)."""
    if not isinstance(entry, dict) or entry.get("kind") not in KINDS:
        return f"an entry of an unknown kind ({str(entry)[:80]})"
    v = entry.get("version")
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        return f"version {v!r} is not a whole number >= 0"
    kind = entry["kind"]
    if kind == "start":
        if entry.get("format") != FORMAT:
            return f"ledger format {entry.get('format')!r}, not {FORMAT}: written by another tidal"
        if version is not None and v > version:
            return f"a start at version {v} after version {version}: the versions between are missing"
    elif version is None:
        return "an entry before the learner's start"
    elif kind == "dropped_batch" and v != version:
        return f"a dropped batch at version {v}, after version {version}"
    elif kind in ("update", "reset") and v != version + 1:
        return f"version {v} follows version {version}: an entry is missing"
    if kind in WEIGHT_KINDS:
        digest = entry.get("digest")
        if not isinstance(digest, dict) or not digest or not all(
                isinstance(k, str) and isinstance(d, str) and _HEX.match(d) for k, d in digest.items()):
            return "its weights' digest is not a map of tensor names to 16 hex digits"
    if kind in ("update", "dropped_batch"):
        batch = entry.get("batch")
        if not isinstance(batch, dict) or not isinstance(batch.get("life"), str) or not isinstance(
                batch.get("member"), str) or isinstance(batch.get("seq"), bool) or not isinstance(batch.get("seq"), int):
            return "its batch is not {life, member, seq}"
        if not re.match(r"^[A-Za-z0-9_.-]+$", batch["life"] + batch["member"]):
            return f"its batch names a life or member that is no plain name: {batch['life']!r}, {batch['member']!r}"
    if kind == "update":
        lr, seed = entry.get("lr"), entry.get("seed")
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 <= lr < float("inf"):
            return f"learning rate {lr!r} is no finite number >= 0"
        if isinstance(seed, bool) or not isinstance(seed, int):
            return f"seed {seed!r} is not a whole number"
        guard = entry.get("guard")
        if not isinstance(guard, dict) or guard.get("rollback") not in (0, 1) or guard.get("anchored") not in (0, 1):
            return "its guard's move is not {rollback: 0|1, anchored: 0|1, ...}"
        mv = entry.get("max_version")
        if mv is not None and (isinstance(mv, bool) or not isinstance(mv, int)):
            return f"max_version {mv!r} is neither a whole number nor null"
    return ""
