"""A checkpoint is read as plain data: a run directory someone else wrote cannot run code on resume."""

import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from actors.models.checkpoints import UnsafeCheckpoint, load_trainer_state, main as upgrade_main
from actors.learner.actor import LearnerConfig
from actors.learner.trainer import Trainer
from actors.models.checkpoint_dir import OPTIMIZER_DIR, TRAINER_STATE
from tests.factories import random_table as table


class Mkdir:
    """A pickle that makes a directory when unpickled: a stand-in for any code a hostile file would run."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return os.mkdir, (self.path,)


@pytest.fixture(scope="module")
def checkpoint(tiny_model_dir, tmp_path_factory):
    from transformers import AutoConfig

    cfg = LearnerConfig(model_path=str(tiny_model_dir), device="cpu", objective={"advantage": "rae_state"})
    trainer = Trainer(cfg)
    trainer.load(None)
    trainer.update(table(0, AutoConfig.from_pretrained(tiny_model_dir).vocab_size), 1e-3, 0)
    assert len(trainer.state.state_values) > 0  # the RAE state baselines, the object that used to be pickled
    path = tmp_path_factory.mktemp("checkpoint") / "policy"
    trainer.save(path, {"version": 1, "rng": torch.get_rng_state(), "cursor": {"life": "a", "seq": 1}})
    return cfg, trainer, path


def test_a_fresh_checkpoint_loads_with_weights_only_and_restores_the_trainer(checkpoint):
    cfg, trained, path = checkpoint
    state = torch.load(path / TRAINER_STATE, weights_only=True)  # raises on any pickled object
    assert state["cursor"] == {"life": "a", "seq": 1} and isinstance(state["state_values"], dict)
    restored = Trainer(cfg)
    restored.load(path)
    assert restored.state.state_values.table == trained.state.state_values.table
    assert list(restored.state.state_values.table) == list(trained.state.state_values.table)  # recency order too
    assert restored.state.role_ids == trained.state.role_ids and restored.state.baselines == trained.state.baselines
    steps = [float(s["step"]) for s in restored.optimizer.state.values()]  # read through the checked reader
    assert steps and steps == [float(s["step"]) for s in trained.optimizer.state.values()] and steps[0] > 0


def test_an_old_pickled_trainer_state_is_refused_until_its_owner_converts_it(checkpoint, tmp_path):
    _, trained, path = checkpoint
    old = tmp_path / "policy"
    old.mkdir()
    state = torch.load(path / TRAINER_STATE, weights_only=True)
    torch.save({**state, "format": 1, "state_values": trained.state.state_values}, old / TRAINER_STATE)
    with pytest.raises(UnsafeCheckpoint, match=rf"{TRAINER_STATE}.*python -m actors.models.checkpoints {old}"):
        load_trainer_state(old / TRAINER_STATE)
    assert upgrade_main([str(old)]) == 0  # the explicit opt-in: its owner trusts it
    assert load_trainer_state(old / TRAINER_STATE)["state_values"] == state["state_values"]


def test_code_in_a_checkpoints_files_never_runs(checkpoint, tmp_path):
    cfg, _, path = checkpoint
    marker = tmp_path / "ran"
    hostile = tmp_path / "hostile"
    shutil.copytree(path, hostile)
    torch.save({"version": 1, "payload": Mkdir(str(marker))}, hostile / TRAINER_STATE)
    with pytest.raises(UnsafeCheckpoint):
        load_trainer_state(hostile / TRAINER_STATE)
    torch.save(torch.load(path / TRAINER_STATE, weights_only=True), hostile / TRAINER_STATE)
    # torch.distributed.checkpoint reads its metadata with plain pickle.load: not here
    (hostile / OPTIMIZER_DIR / ".metadata").write_bytes(pickle.dumps(Mkdir(str(marker))))
    with pytest.raises(UnsafeCheckpoint, match="posix.mkdir, which is not checkpoint metadata"):
        Trainer(cfg).load(hostile)
    assert not Path(marker).exists()


def test_a_spill_file_that_is_not_replays_is_skipped_and_runs_no_code(tmp_path):
    import pyarrow as pa

    from actors.replay.spill import Spill

    marker = tmp_path / "ran"
    field = pa.field("x", pa.int64(), metadata={b"ARROW:extension:name": b"arrow.py_extension_type",
                                                  b"ARROW:extension:metadata": pickle.dumps(Mkdir(str(marker)))})
    foreign = pa.table([pa.array([1, 2])], schema=pa.schema([field]))
    spill = tmp_path / "replay"
    spill.mkdir()
    with open(spill / "episodes-1-1.arrows", "wb") as f:
        with pa.ipc.new_stream(f, foreign.schema) as writer:
            writer.write_table(foreign)
    episodes, batches = Spill(str(spill)).load()
    assert episodes == {} and batches == {} and not marker.exists()


def redirected(path: Path, to: Path, edit) -> Path:
    """A copy of the checkpoint at ``path`` whose optimizer metadata was changed by ``edit(storage_info)`` for
    every item (as a hostile run directory would)."""
    from actors.models.checkpoints import read_metadata

    shutil.copytree(path, to)
    metadata_path = to / OPTIMIZER_DIR / ".metadata"
    with open(metadata_path, "rb") as f:
        metadata = read_metadata(f)
    for index, info in list(metadata.storage_data.items()):
        metadata.storage_data[index] = edit(info)
    metadata_path.write_bytes(pickle.dumps(metadata))
    return to


def moved(info, **changes):
    import dataclasses

    return dataclasses.replace(info, **changes)


@pytest.mark.parametrize("case", ["absolute", "dotdot", "dev_zero", "fifo", "link", "past_the_end"])
def test_optimizer_metadata_naming_bytes_outside_the_checkpoint_is_refused(checkpoint, tmp_path, case):
    """Review new 6 (a): an item redirected outside ``optimizer/``, to a device, a FIFO (the learner's start
    blocked for ever) or a link, or past its file's end, is refused before anything is read."""
    cfg, _, path = checkpoint
    outside = tmp_path / "outside.distcp"
    shutil.copy(next((path / OPTIMIZER_DIR).glob("*.distcp")), outside)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    edits = {"absolute": lambda i: moved(i, relative_path=str(outside)),
             "dotdot": lambda i: moved(i, relative_path="../../outside.distcp"),
             "dev_zero": lambda i: moved(i, relative_path="/dev/zero", length=512 << 20),
             "fifo": lambda i: moved(i, relative_path=str(fifo)),
             "link": lambda i: moved(i, relative_path="link.distcp"),
             "past_the_end": lambda i: moved(i, length=i.length + 10**9)}
    hostile = redirected(path, tmp_path / "hostile", edits[case])
    (hostile / OPTIMIZER_DIR / "link.distcp").symlink_to(outside)
    expected = {"absolute": "not a file of", "dotdot": "not a file of", "dev_zero": "not a file of",
                "fifo": "not a file of", "link": "not a regular file", "past_the_end": "claims bytes"}[case]
    with pytest.raises(UnsafeCheckpoint, match=expected):
        Trainer(cfg).load(hostile)


def test_a_fifo_in_place_of_the_optimizer_metadata_is_refused_at_once(checkpoint, tmp_path):
    cfg, _, path = checkpoint
    hostile = tmp_path / "hostile"
    shutil.copytree(path, hostile)
    (hostile / OPTIMIZER_DIR / ".metadata").unlink()
    os.mkfifo(hostile / OPTIMIZER_DIR / ".metadata")
    with pytest.raises(UnsafeCheckpoint, match="not a regular file"):
        Trainer(cfg).load(hostile)
