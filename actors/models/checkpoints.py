"""Reading a checkpoint runs no code from it: every file of a learner's checkpoint is read as plain data.

A checkpoint directory holds the policy (safetensors, read by ``from_pretrained``), ``trainer_state.pt`` and
``optimizer/`` (torch.distributed.checkpoint). ``torch.load`` unpickles, and a pickle can call any function: a
run directory that someone else could write would run their code on ``tidal launch resume=...``. So:

- ``trainer_state.pt`` holds only tensors, numbers, strings and containers (the RAE state baselines as a list of
  rows, not a ``StateValues`` object), and is read with ``torch.load(weights_only=True)``: anything else in it
  fails the load (`load_trainer_state`), with a message saying what to do.
- ``optimizer/`` is read with a storage reader whose metadata unpickler admits only torch.distributed.checkpoint's
  own metadata classes, torch sizes and dtypes (torch itself reads that file with plain ``pickle.load``), and a
  planner that reads its non-tensor values with ``weights_only=True`` (torch reads them with
  ``weights_only=False``) (`load_optimizer`).

A ``trainer_state.pt`` written before this (with a pickled ``StateValues`` in it) is refused, naming the file
and the command that converts it once, for a checkpoint its owner trusts: ``python -m actors.models.checkpoints DIR``.
"""

from __future__ import annotations

import argparse
import io
import pickle
import sys
from collections import OrderedDict
from pathlib import Path

import torch

from actors.models.checkpoint_dir import TRAINER_STATE, find_checkpoint
from algos.advantages import StateValues

FORMAT = 2  # trainer_state.pt: plain data only (1: before, with pickled objects)
def checkpoint_cursor(save_dir: str | Path, life: str) -> int:
    """The number of the last batch the checkpoint in ``save_dir`` had consumed in ``life`` (0: none)."""
    checkpoint = find_checkpoint(save_dir)
    if checkpoint is None:
        return 0
    cursor = load_trainer_state(checkpoint / TRAINER_STATE).get("cursor", {})
    return cursor["seq"] if cursor.get("life") == life else 0


class UnsafeCheckpoint(ValueError):
    """A checkpoint file that holds more than plain data."""


def plain_state_values(values: StateValues | None) -> dict | None:
    """``StateValues`` as plain data (its entries in least-recently-seen order)."""
    if values is None:
        return None
    rows = [[role, state, visits, mean] for (role, state), (visits, mean) in values.table.items()]
    return {"window": values.window, "capacity": values.capacity, "rows": rows}


def state_values_from_plain(data: dict | None) -> StateValues | None:
    if data is None:
        return None
    if isinstance(data, StateValues):  # read from an old checkpoint by `upgrade`
        return data
    values = StateValues(int(data["window"]), int(data["capacity"]))
    values.table = OrderedDict(((int(role), state), (int(visits), float(mean)))
                               for role, state, visits, mean in data["rows"])
    return values


def load_trainer_state(path: Path) -> dict:
    """``trainer_state.pt`` as plain data (``weights_only=True``); UnsafeCheckpoint if it holds anything else."""
    try:
        return torch.load(path, weights_only=True)
    except pickle.UnpicklingError as error:
        raise UnsafeCheckpoint(
            f"{path} holds pickled Python objects (a checkpoint from an older tidal, or not tidal's), which can run "
            f"code when loaded; tidal reads checkpoints as plain data only. If you trust this file, convert it "
            f"once: python -m actors.models.checkpoints {path.parent}  ({str(error).splitlines()[0]})") from None


def upgrade(checkpoint: Path) -> bool:
    """Rewrite an older ``trainer_state.pt`` as plain data (unpickling it once: only for a trusted file)."""
    path = Path(checkpoint) / TRAINER_STATE
    state = torch.load(path, weights_only=False)
    if state.get("format") == FORMAT:
        return False
    values = state.get("state_values")
    state["state_values"] = plain_state_values(values) if isinstance(values, StateValues) else values
    state["format"] = FORMAT
    buffer = io.BytesIO()
    torch.save(state, buffer)
    torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)  # plain data now, or this raises before writing
    path.write_bytes(buffer.getvalue())
    return True


# -- optimizer/: torch.distributed.checkpoint read without unpickling anything but its own metadata ---------------

def _metadata_classes() -> dict[tuple[str, str], object]:
    import torch.distributed.checkpoint.filesystem as filesystem
    import torch.distributed.checkpoint.metadata as metadata

    allowed = {(metadata.__name__, name): value for name, value in vars(metadata).items()
               if isinstance(value, type) and value.__module__ == metadata.__name__}
    allowed[(filesystem.__name__, "_StorageInfo")] = filesystem._StorageInfo
    allowed[("torch", "Size")] = torch.Size
    allowed[("torch.serialization", "_get_layout")] = torch.serialization._get_layout
    allowed[("collections", "OrderedDict")] = OrderedDict
    for name in ("PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"):
        import pathlib

        allowed[("pathlib", name)] = getattr(pathlib, name)
    return allowed


class _MetadataUnpickler(pickle.Unpickler):
    allowed: dict = {}

    def find_class(self, module: str, name: str):
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        found = self.allowed.get((module, name))
        if found is None:
            raise UnsafeCheckpoint(f"checkpoint metadata names {module}.{name}, which is not checkpoint metadata")
        return found


def read_metadata(stream):
    """torch.distributed.checkpoint's metadata from ``stream``, unpickling only its own classes."""
    unpickler = _MetadataUnpickler(stream)
    unpickler.allowed = _metadata_classes()
    return unpickler.load()


def load_optimizer(state: dict, path: Path, process_group=None) -> None:
    """``dcp.load(state, path)``, reading only data (see the module's docstring), coordinated over
    ``process_group`` (a learner group's gloo control group: no NCCL collective on whichever device is current)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader

    with open(Path(path) / ".metadata", "rb") as f:  # refused here with its reason, not inside dcp's own errors
        read_metadata(f)

    class Reader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            with self.fs.create_stream(self._get_metadata_path(kwargs.get("rank")), "rb") as f:
                metadata = read_metadata(f)
            from torch.distributed.checkpoint.metadata import StorageMeta

            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    class Planner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value: io.BytesIO) -> None:
            super().load_bytes(read_item, io.BytesIO(_plain_bytes(value)))

    dcp.load(state, storage_reader=Reader(str(path)), planner=Planner(), process_group=process_group)


def _plain_bytes(value: io.BytesIO) -> bytes:
    """The torch-saved value in ``value``, checked to be plain data (``weights_only``), re-saved for the planner."""
    data = value.read()
    try:
        torch.load(io.BytesIO(data), weights_only=True)
    except pickle.UnpicklingError as error:
        raise UnsafeCheckpoint(f"an optimizer value in the checkpoint is not plain data: {error}") from None
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m actors.models.checkpoints",
                                     description="Convert a trusted older checkpoint's trainer_state.pt to plain data.")
    parser.add_argument("checkpoint", help="the checkpoint directory (e.g. runs/<name>/policy)")
    args = parser.parse_args(argv)
    changed = upgrade(Path(args.checkpoint))
    print(f"{args.checkpoint}: " + ("converted to plain data" if changed else "already plain data"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
