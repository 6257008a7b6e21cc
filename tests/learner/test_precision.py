"""Where the learner's model lives and in what precision: fp32 parameters and optimizer state whatever dtype the
checkpoint was saved in, no float16 (no loss scaler), the model sharded from the CPU, and each rank's GPU made
current wherever torch asks for it (the rank's own, in whichever thread runs the method)."""

import threading

import pytest
import torch

from actors.cli import load_config
from actors.learner import trainer as trainer_module
from actors.learner.actor import LearnerConfig
from actors.learner.group import Shard, join_group
from actors.learner.trainer import Trainer
from actors.learner.update import Objective
from actors.models.base_model import load_policy
from tests.factories import random_table


@pytest.fixture(scope="module")
def bf16_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model saved in bfloat16, as real checkpoints are."""
    path = tmp_path_factory.mktemp("bf16") / "model"
    model, tokenizer = load_policy(tiny_model_dir)
    model.to(torch.bfloat16).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_a_bf16_checkpoint_is_trained_with_fp32_parameters_reference_and_optimizer_state(bf16_model_dir):
    """transformers loads a model in the dtype it was saved in: a bf16 checkpoint would be trained in bf16, its
    AdamW moments in bf16 too, and updates near 1e-6 of a weight round to nothing."""
    assert {p.dtype for p in load_policy(bf16_model_dir)[0].parameters()} == {torch.bfloat16}  # what it would be
    trainer = Trainer(LearnerConfig(model_path=str(bf16_model_dir), device="cpu", lr=1e-3,
                                    objective=Objective(kl_coef=0.1, minibatches=1)))
    trainer.load(None)
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}
    assert {p.dtype for p in trainer.reference.parameters()} == {torch.float32}
    assert not any(p.requires_grad for p in trainer.reference.parameters())
    stats = trainer.update(random_table(0, trainer.model.config.vocab_size), 1e-3, 0)
    assert stats["rows_trained"] > 0 and stats["kl_ref"] == 0.0  # the reference computes as the policy does
    moments = [v for state in trainer.optimizer.state.values() for k, v in state.items() if k != "step"]
    assert moments and {m.dtype for m in moments} == {torch.float32}


def test_float16_for_the_learner_is_refused_when_the_config_is_checked():
    for name in ("fp16", "float16"):
        with pytest.raises(ValueError, match=f"dtype={name}: the learner does not compute in float16"):
            LearnerConfig(model_path="m", dtype=name)
    with pytest.raises(ValueError, match="does not compute in float16"):
        load_config(["learner.args.dtype=fp16"])
    assert LearnerConfig(model_path="m", dtype="bf16").dtype == "bf16"
    assert load_config(["rollout.args.dtype=fp16"]).rollout.args.dtype == "fp16"  # sampling in fp16 is fine


@pytest.fixture
def two_gpus(monkeypatch):
    """A CPU machine that says it has two GPUs; ``torch.cuda.device`` records the devices made current."""
    current = []

    class Current:
        def __init__(self, device):
            self.device = device

        def __enter__(self):
            current.append((self.device, threading.current_thread().name))

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "device", Current)
    return current


def test_a_rank_trains_on_its_own_gpu_made_current_in_every_collective_in_any_thread(two_gpus):
    """The current device is per thread, and trio runs a learner's load and its updates in whichever worker
    thread: every collective method makes the rank's device current again."""
    assert Trainer(LearnerConfig(model_path="m", device="cuda"), Shard(1, 2)).device == torch.device("cuda:1")
    trainer = Trainer(LearnerConfig(model_path="m", device="cuda:1"))
    trainer.model = torch.nn.Linear(2, 2)  # a CPU model: keep_anchor's work needs no GPU
    worker = threading.Thread(target=trainer.keep_anchor, name="trio-worker")
    worker.start()
    worker.join()
    assert two_gpus == [(torch.device("cuda:1"), "trio-worker")]
    assert len(trainer._anchors) == 1


def test_a_rank_joins_its_group_with_its_gpu_current_and_bound_to_nccl(monkeypatch):
    import torch.distributed as dist

    from actors.learner import group

    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.append(("set_device", device)))
    monkeypatch.setattr(dist, "init_process_group", lambda **kwargs: calls.append(("init", kwargs)))
    monkeypatch.setattr(group, "proved_members", lambda shard, secret: None)  # no group to prove anything to
    join_group(Shard(1, 2), torch.device("cuda:1"), "secret@host:1", store="store")
    assert calls[0] == ("set_device", torch.device("cuda:1"))  # before NCCL, FSDP or the mesh ask for it
    assert calls[1][1]["backend"] == "nccl" and calls[1][1]["device_id"] == torch.device("cuda:1")
    calls.clear()
    join_group(Shard(1, 2), torch.device("cpu"), "secret@host:1", store="store")
    assert [name for name, _ in calls] == ["init"] and calls[0][1]["backend"] == "gloo"
    assert calls[0][1]["device_id"] is None


def test_a_group_shards_the_model_from_the_cpu_in_fp32(two_gpus, bf16_model_dir, monkeypatch):
    """No rank's GPU holds the whole unsharded model: it is sharded from the CPU (FSDP moves each block to the
    device as it shards it), in fp32 whatever it was saved in."""
    seen = []
    monkeypatch.setattr(trainer_module, "shard_model", lambda model, world, device, dtype: seen.append(
        ({(p.device.type, p.dtype) for p in model.parameters()}, world, device, dtype)))
    trainer = Trainer(LearnerConfig(model_path=str(bf16_model_dir), device="cuda"), Shard(1, 2))
    model, _ = trainer._policy(bf16_model_dir)
    assert seen == [({("cpu", torch.float32)}, 2, torch.device("cuda:1"), torch.bfloat16)]
    assert {p.device.type for p in model.parameters()} == {"cpu"}  # left where it was for FSDP to move
