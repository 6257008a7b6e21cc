"""Where the rollout's hf models run and in what precision (``rollout.args.device``/``dtype``). The cases that need
a GPU are in ``tests/unit/test_rollout_devices.py``, the module the offline GPU kit runs."""

import pytest
import torch
import trio

from actors.cli import load_config
from actors.models.base_model import load_policy
from actors.rollout.sampling import device_generator, generator_for, sample
from actors.models.snapshots import write_snapshot
from actors.rollout.actor import RolloutConfig, start_engine
from actors.rollout.weights import HeldWeights
from streams.weights import FetchedWeights, weights_to_bytes

PROMPTS = ["TicTacToe. You are X.\n1|2|3\n4|5|6\n7|8|9\nMove:", "Hi", "TicTacToe. You are O."]


def encoded(tokenizer):
    return [tokenizer(t)["input_ids"] for t in PROMPTS]


def started(cfg: RolloutConfig, name: str = "rollout"):
    """The hf engine ``cfg`` makes, its model loaded, and the weights it holds."""
    weights = HeldWeights(cfg.policy_id, name)
    return start_engine(cfg, weights, name), weights


def perturbed(model, seed: int = 0):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(seed + p.numel())))
    return model


@pytest.mark.parametrize("key, value", [("device", "tpu"), ("device", "cuda:x"), ("device", "cpu:0"),
                                        ("dtype", "int8"), ("dtype", "float64")])
def test_unknown_device_or_dtype_settings_fail_naming_the_key_and_value(key, value):
    with pytest.raises(ValueError, match=rf"rollout\.args\.{key}: unknown {key} '{value}'"):
        RolloutConfig(model_path="m", **{key: value})
    with pytest.raises(ValueError, match=rf"rollout\.args\.{key}: unknown {key} '{value}'"):
        load_config([f"rollout.args.{key}={value}"])


def test_device_and_dtype_settings_compose_from_the_config():
    cfg = load_config(["rollout.args.device=cuda:1", "rollout.args.dtype=bf16"])
    assert (cfg.rollout.args.device, cfg.rollout.args.dtype) == ("cuda:1", "bf16")  # checked, resolved on load
    assert (load_config([]).rollout.args.device, load_config([]).rollout.args.dtype) == ("auto", "auto")


@pytest.mark.skipif(torch.cuda.is_available(), reason="auto picks the GPU where there is one")
def test_the_default_places_the_policy_on_the_cpu_in_float32(tiny_model_dir):
    engine, _ = started(RolloutConfig(model_path=str(tiny_model_dir)))
    assert (engine.sampler.device, engine.sampler.dtype) == (torch.device("cpu"), torch.float32)
    assert {(p.device.type, p.dtype) for p in engine.model.parameters()} == {("cpu", torch.float32)}


def test_cuda_asked_for_without_a_gpu_is_refused_naming_the_setting(tiny_model_dir, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for device in ("cuda", "cuda:1"):
        with pytest.raises(RuntimeError, match=rf"rollout-3: rollout\.args\.device={device} but no CUDA GPU"):
            started(RolloutConfig(model_path=str(tiny_model_dir), device=device), name="rollout-3")


def test_a_bfloat16_policy_samples_takes_learner_weights_and_snapshots_in_bfloat16(tiny_model_dir, tmp_path):
    """device=cpu dtype=bfloat16: the policy, the weights a learner publishes (float32) and a league snapshot all
    end up in bfloat16 on the device; samples are plain lists, their log-probs float32 numbers."""
    engine, weights = started(RolloutConfig(model_path=str(tiny_model_dir), device="cpu", dtype="bfloat16",
                                            snapshot_dir=str(tmp_path)))
    model, tokenizer, device = engine.model, engine.tokenizer, engine.sampler.device
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    prompts = encoded(tokenizer)
    samples = sample(model, prompts, eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id,
                     temperature=1.0, max_new_tokens=5, generator=device_generator(device, 0))
    assert len(samples) == len(prompts)
    for s in samples:
        assert 1 <= len(s.tokens) == len(s.logprobs) == len(s.versions) <= 5
        assert all(type(t) is int for t in s.tokens) and all(type(lp) is float and lp <= 0 for lp in s.logprobs)
        assert s.finished == (s.tokens[-1] == tokenizer.eos_token_id)

    learner, _ = load_policy(tiny_model_dir)  # float32, as a learner on the CPU publishes it

    async def take_weights():
        weights.offer(FetchedWeights(1, bytearray(weights_to_bytes(perturbed(learner)))))
        await weights.wait_for(1, engine.load)

    trio.run(take_weights)
    assert weights.version == 1
    for (name, param), expected in zip(model.named_parameters(), learner.parameters()):
        assert param.dtype == torch.bfloat16 and param.device == device, name
        assert torch.equal(param, expected.to(torch.bfloat16)), name

    write_snapshot(perturbed(load_policy(tiny_model_dir)[0], seed=1), tokenizer, tmp_path / "main-v3")
    snapshot, version = trio.run(engine.snapshots.get, "main-v3")
    assert version == 3
    assert {(p.device, p.dtype) for p in snapshot.parameters()} == {(device, torch.bfloat16)}


class KindOnly:
    """A generator made for ``cuda`` as torch reports it: a device with no index (no draw may be made with it)."""

    device = torch.device("cuda")


def test_a_generator_made_for_the_models_kind_of_device_is_used_as_is_whatever_the_index():
    """A GPU rollout's generator is made for ``cuda`` and its model sits on ``cuda:0``: the same kind, so the
    generator draws as it is (comparing the devices themselves reseeded it with a CPU draw on a CUDA generator,
    which torch refuses, on every GPU sample)."""
    generator = KindOnly()
    assert generator_for(torch.device("cuda:0"), generator) is generator
    assert generator_for(torch.device("cpu"), None) is None
    cpu = torch.Generator().manual_seed(3)
    assert generator_for(torch.device("cpu"), cpu) is cpu


def test_a_generator_of_another_kind_seeds_one_on_the_models_device_drawing_on_its_own(monkeypatch):
    from actors.rollout import sampling

    made = []
    monkeypatch.setattr(sampling, "device_generator", lambda device, seed: made.append((device, seed)) or "seeded")
    assert generator_for(torch.device("cuda:1"), torch.Generator().manual_seed(5)) == "seeded"
    expected = int(torch.randint(2**62, (), generator=torch.Generator().manual_seed(5)))
    assert made == [(torch.device("cuda:1"), expected)]  # reproducible: the seed is the CPU generator's next draw


def test_a_batch_is_sampled_in_passes_of_one_setting_and_prompt_lengths_within_2x(tiny_model_dir, monkeypatch):
    """A role game's long proposer prompts and short solver prompts pad each other in no pass; every request is
    answered once, by its own prompt's continuation."""
    from actors.rollout import hf_engine
    from streams.messages import GenerationRequest

    engine, _ = started(RolloutConfig(model_path=str(tiny_model_dir)))
    passes = []

    def recording(model, prompts, **kwargs):
        passes.append(([len(p) for p in prompts], kwargs["temperature"]))
        return sample(model, prompts, **kwargs)

    monkeypatch.setattr(hf_engine, "sample", recording)
    lengths = [200, 8, 190, 9, 60, 100, 7, 210]
    batch = [GenerationRequest(i, "inproc://env", "main", [5 + (i + j) % 50 for j in range(n)],
                               1.0 if i % 3 else 0.7, 4, 0) for i, n in enumerate(lengths)]
    answers = trio.run(engine.generate, batch)
    assert sorted(request.request_id for _, request in answers) == list(range(len(batch)))
    assert all(completion.request_id == request.request_id and 1 <= len(completion.token_ids) <= 4
               for completion, request in answers)
    assert sorted(n for widths, _ in passes for n in widths) == sorted(lengths)
    assert all(max(widths) < 2 * min(widths) for widths, _ in passes)
    assert {t for _, t in passes} == {1.0, 0.7} and len(passes) >= 5  # 7-9 | 60 | 100 | 190-210, per temperature
