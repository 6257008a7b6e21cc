"""Frozen snapshots of a learning member: written once, checksummed, never overwritten.

A snapshot is a Hugging Face model directory under the run's ``league/snapshots/<member>-v<version>/``, with a
``CHECKSUMS.json`` naming the SHA-256 of every file in it. It is written to a ``.partial`` directory and renamed
into place, so a process killed while writing leaves no half-snapshot under the final name; a name that exists
is refused, never replaced (users lost games to snapshot weights that were overwritten under them). Its files are
made read-only. Whoever loads one checks every file against ``CHECKSUMS.json`` first.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from pathlib import Path

from actors.models.checksums import CHECKSUMS, checksum_problem, write_checksums

_SNAPSHOT_ID = re.compile(r"^(?P<member>[A-Za-z0-9_.]+(?:-[A-Za-z0-9_.]+)*?)-v(?P<version>\d+)$")


class SnapshotError(RuntimeError):
    """A snapshot that is missing, incomplete, or whose bytes do not match its checksums."""


def snapshot_id(member: str, version: int) -> str:
    return f"{member}-v{version}"


def parse_snapshot_id(policy_id: str) -> tuple[str, int] | None:
    """(member, version) of a snapshot id like ``main-v12``; None for anything else (a member, an opponent)."""
    match = _SNAPSHOT_ID.match(policy_id)
    return (match["member"], int(match["version"])) if match else None


def write_snapshot(model, tokenizer, directory: str | Path, state_dict: dict | None = None) -> Path:
    """Save ``model`` (with ``state_dict``'s weights, if given: a sharded model's, gathered) and ``tokenizer`` as
    an immutable snapshot at ``directory``; refuses an existing one."""
    final = Path(directory)
    if final.exists():
        raise FileExistsError(f"snapshot {final} exists already; snapshots are never overwritten")
    partial = final.with_name(final.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)  # a write cut short by a kill
    model.save_pretrained(partial, state_dict=state_dict)
    tokenizer.save_pretrained(partial)
    write_checksums(partial)
    for path in partial.iterdir():
        path.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    os.rename(partial, final)  # fails if another writer got there first: nothing is replaced
    return final


def verify_snapshot(directory: str | Path) -> Path:
    """The snapshot's directory, once every file matches its checksum; SnapshotError naming what does not."""
    path = Path(directory)
    if not (path / CHECKSUMS).exists():
        raise SnapshotError(f"{path} is not a snapshot (no {CHECKSUMS}): missing or cut short while written")
    problem = checksum_problem(path)
    if problem is not None:
        raise SnapshotError(f"snapshot {path}: {problem}")
    return path


def load_snapshot(directory: str | Path):
    """(model, tokenizer) of a verified snapshot."""
    from actors.models.base_model import load_policy

    return load_policy(verify_snapshot(directory))
