"""The tests that need a CUDA GPU, in one module: the one that ``../shared/tools/gpu-kit.sh --tests`` runs on a
bare, offline GPU machine after ``benchmarks/gpu_check.py`` (the kit names this path). Each is skipped where no
GPU is visible; what of the same defects a CPU can pin is tested beside the code (``tests/rollout``,
``tests/learner``, ``tests/models``). This module imports what the kit carries: torch, transformers, trio, pytest
and tidal, nothing of Ray or vLLM.
"""

import pytest
import torch
import trio

from actors.learner.actor import LearnerConfig
from actors.learner.trainer import Trainer
from actors.learner.update import Objective
from actors.models.base_model import load_policy
from actors.rollout.actor import RolloutConfig, start_engine
from actors.rollout.hf_engine import passes
from actors.rollout.sampling import sample
from actors.rollout.weights import HeldWeights
from streams.messages import GenerationRequest
from tests.factories import random_table

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
PROMPTS = ["TicTacToe. You are X.\n1|2|3\n4|5|6\n7|8|9\nMove:", "Hi", "TicTacToe. You are O."]


def hf_engine(model_dir, device: str = "cuda"):
    return start_engine(RolloutConfig(model_path=str(model_dir), device=device), HeldWeights("main", "rollout"),
                        "rollout")


def test_the_policy_generates_on_the_gpu_with_its_own_generator_or_a_cpu_one(tiny_model_dir):
    """On a GPU, in bfloat16: the sampler's own generator (made for ``cuda``, the model on ``cuda:0``) draws as it
    is; a CPU generator seeds one on the GPU (same seed, same draws); log-probs agree with a float32 recomputation
    on the CPU to bfloat16's precision."""
    engine = hf_engine(tiny_model_dir)
    model, tokenizer, sampler = engine.model, engine.tokenizer, engine.sampler
    assert sampler.dtype == torch.bfloat16 and next(model.parameters()).is_cuda
    assert sampler.generator.device.type == "cuda"
    prompts = [tokenizer(t)["input_ids"] for t in PROMPTS]
    kwargs = dict(eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id, temperature=1.0, max_new_tokens=6)
    on_gpu = sample(model, prompts, generator=sampler.generator, **kwargs)
    from_cpu = [sample(model, prompts, generator=torch.Generator().manual_seed(7), **kwargs) for _ in range(2)]
    assert from_cpu[0] == from_cpu[1]  # reproducible from the CPU generator's seed
    reference = load_policy(tiny_model_dir)[0]
    for prompt, s in zip(prompts, on_gpu):
        ids = torch.tensor([prompt + s.tokens])
        with torch.no_grad():
            logps = torch.log_softmax(reference(ids).logits[0, len(prompt) - 1:-1].float(), -1)
        picked = logps.gather(-1, torch.tensor(s.tokens)[:, None])[:, 0]
        assert picked.tolist() == pytest.approx(s.logprobs, abs=0.1)


def test_the_hf_engine_answers_a_batch_on_the_gpu(tiny_model_dir):
    """The rollout's own path end to end: requests in, completions with a log-prob and a version per token."""
    engine = hf_engine(tiny_model_dir)
    prompt = engine.tokenizer(PROMPTS[0])["input_ids"]
    batch = [GenerationRequest(i, "inproc://env", "main", prompt, 1.0, 4, 0) for i in range(3)]
    assert len(passes(batch)) == 1
    answers = trio.run(engine.generate, batch)
    assert sorted(request.request_id for _, request in answers) == [0, 1, 2]
    for completion, _ in answers:
        assert 1 <= len(completion.token_ids) == len(completion.logprobs) == len(completion.versions) <= 4


def test_the_learner_trains_on_the_gpu_with_fp32_state_in_bf16_compute_and_anchors_on_the_cpu(tiny_model_dir,
                                                                                             tmp_path):
    """A bf16 checkpoint on the GPU: fp32 parameters, reference and AdamW moments there, passes in bf16 (the KL to
    the reference zero before the first step), the guard's anchors held on the CPU and restored onto the GPU."""
    path = tmp_path / "bf16"
    model, tokenizer = load_policy(tiny_model_dir)
    model.to(torch.bfloat16).save_pretrained(path)
    tokenizer.save_pretrained(path)
    trainer = Trainer(LearnerConfig(model_path=str(path), device="cuda", lr=1e-3,
                                    objective=Objective(kl_coef=0.1, minibatches=1)))
    assert trainer.dtype == torch.bfloat16
    trainer.load(None)
    params = list(trainer.model.parameters())
    assert {(p.device.type, p.dtype) for p in params} == {("cuda", torch.float32)}
    assert {(p.device.type, p.dtype) for p in trainer.reference.parameters()} == {("cuda", torch.float32)}
    trainer.keep_anchor()
    assert {v.device.type for v in trainer._anchors[0].values()} == {"cpu"}
    before = [p.detach().clone() for p in params]
    stats = trainer.update(random_table(0, trainer.model.config.vocab_size), 1e-3, 0)
    assert stats["rows_trained"] > 0 and stats["skipped_steps"] == 0 and stats["kl_ref"] == 0.0
    moments = [v for state in trainer.optimizer.state.values() for k, v in state.items() if k != "step"]
    assert {(m.device.type, m.dtype) for m in moments} == {("cuda", torch.float32)}
    assert any(not torch.equal(b, p) for b, p in zip(before, params))
    trainer.restore_anchor()
    assert all(torch.equal(b, p) for b, p in zip(before, params))
    assert {p.device.type for p in params} == {"cuda"}


def test_a_gpu_learner_publishes_finite_fp32_weights_on_the_host(tiny_model_dir):
    from streams.weights import weights_to_bytes

    trainer = Trainer(LearnerConfig(model_path=str(tiny_model_dir), device="cuda"))
    trainer.load(None)
    full = trainer.full_state()
    assert {(v.device.type, v.dtype) for v in full.values()} == {("cuda", torch.float32)}
    assert len(weights_to_bytes(full)) >= 4 * sum(v.numel() for v in full.values())
