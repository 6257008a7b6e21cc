"""Reading back what a W&B run logged offline: its ``run-<id>.wandb`` file is a LevelDB-style log (a 7-byte
``:W&B`` header, then 32 KiB blocks of records: CRC32C, length, type, data; a record split over blocks as
first/middle/last pieces) of W&B's protobuf ``Record`` messages. W&B's Python package no longer ships a reader."""

from __future__ import annotations

import json
from pathlib import Path

BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[bytes]:
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    out, pending, pos = [], b"", 7
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        piece, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0:  # padding
            continue
        pending = piece if kind in (FULL, FIRST) else pending + piece
        if kind in (FULL, LAST):
            out.append(pending)
    return out


def history(run_dir: Path) -> list[dict]:
    """Every ``log`` call of the offline W&B runs under ``run_dir/wandb``, as dicts of key -> decoded value."""
    from wandb.proto import wandb_internal_pb2

    logged = []
    for path in sorted(Path(run_dir).glob("wandb/offline-run-*/run-*.wandb")):
        for data in records(path):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(data)
            if record.WhichOneof("record_type") != "history":
                continue
            entry = {}
            for item in record.history.item:  # a dict value (a histogram) comes flattened, one item per key
                *outer, key = [item.key] if item.key else list(item.nested_key)
                place = entry
                for name in outer:
                    place = place.setdefault(name, {})
                place[key] = json.loads(item.value_json)
            logged.append(entry)
    return logged
