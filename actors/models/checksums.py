"""A model directory's checksum file: ``CHECKSUMS.json``, the SHA-256 of every file in it, written once the
directory is complete. A directory whose files do not match it was cut short while written, or changed since:
league snapshots (``snapshots.py``) and the models tidal makes and caches (``random_model.publish_model_dir``)
are checked against it before they are used."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

CHECKSUMS = "CHECKSUMS.json"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_checksums(directory: str | Path) -> dict[str, str]:
    """Write ``directory``'s checksum file (its files as they are now); the sums, by file name."""
    directory = Path(directory)
    sums = {p.name: sha256(p) for p in sorted(directory.iterdir()) if p.is_file() and p.name != CHECKSUMS}
    (directory / CHECKSUMS).write_text(json.dumps(sums, indent=1))
    return sums


def checksum_problem(directory: str | Path) -> str | None:
    """What is wrong with ``directory`` against its checksum file (missing, files added or gone, a file
    changed), or None when every file matches."""
    path = Path(directory)
    sums_path = path / CHECKSUMS
    if not sums_path.is_file():
        return f"no {CHECKSUMS}: missing, cut short while written, or made before checksums"
    try:
        sums = json.loads(sums_path.read_text())
    except ValueError:
        return f"its {CHECKSUMS} does not parse"
    if not isinstance(sums, dict):
        return f"its {CHECKSUMS} is not a list of checksums"
    present = {p.name for p in path.iterdir() if p.is_file()} - {CHECKSUMS}
    if present != set(sums):
        return f"files {sorted(present ^ set(sums))} differ from its checksum list"
    for name, expected in sums.items():
        if sha256(path / name) != expected:
            return f"{name} does not match its checksum (changed after it was written)"
    return None
