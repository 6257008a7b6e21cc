"""Device and precision settings, and what a learner rank asks Ray for."""

import pytest
import torch

from actors.models.devices import check_device, resolve_device, resolve_dtype
from actors.runs.ray_cluster import learner_bundle
from actors.learner.actor import LearnerConfig


def test_auto_is_the_cpu_in_fp32_here_and_a_gpu_in_bf16_where_there_is_one(monkeypatch):
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_dtype("auto", resolve_device("auto")) == (torch.bfloat16 if torch.cuda.is_available()
                                                             else torch.float32)
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert resolve_dtype("float32", torch.device("cuda")) == torch.float32
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto") == torch.device("cuda")
    assert resolve_device("cuda", local_rank=3) == torch.device("cuda:1")  # rank 3 of a node with two GPUs


def test_a_gpu_asked_for_where_there_is_none_and_unknown_names_are_refused_clearly(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a machine without one
    with pytest.raises(RuntimeError, match="device=cuda but no CUDA GPU is visible"):
        resolve_device("cuda")
    for bad in ("gpu", "cuda:x", "cpu:0"):
        with pytest.raises(ValueError, match="unknown device"):
            check_device(bad)
    with pytest.raises(ValueError, match="unknown dtype 'float8'"):
        LearnerConfig(model_path="m", dtype="float8")
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        LearnerConfig(model_path="m", device="tpu")
    with pytest.raises(ValueError, match="ranks must be >= 1"):
        LearnerConfig(model_path="m", ranks=0)


def test_a_learner_rank_asks_for_a_gpu_where_the_cluster_has_gpus_unless_it_trains_on_the_cpu():
    assert learner_bundle({}, cluster_gpus=4, device="auto") == {"GPU": 1}
    assert learner_bundle({"trainer": 1}, cluster_gpus=4, device="cuda") == {"trainer": 1, "GPU": 1}
    assert learner_bundle({"GPU": 2}, cluster_gpus=4, device="auto") == {"GPU": 2}  # as ray.resources.learner says
    assert learner_bundle({}, cluster_gpus=4, device="cpu") == {"CPU": 0.01}
    assert learner_bundle({}, cluster_gpus=0, device="auto") == {"CPU": 0.01}


def test_a_learner_group_of_several_ranks_needs_ray_and_at_least_one_rank():
    from actors.cli import load_config

    assert load_config(["learner.ranks=2"]).learner.ranks == 2
    with pytest.raises(ValueError, match="learner.ranks=2 needs run.mode=ray"):
        load_config(["learner.ranks=2", "run.mode=local"])
    with pytest.raises(ValueError, match="learner.ranks=0: a run needs at least one"):
        load_config(["learner.ranks=0"])
    assert load_config(["learner.args.max_tokens_per_microbatch=4096"]).learner.args.max_tokens_per_microbatch == 4096
