"""The GPU check, one command: learner tokens/s and MFU, peak memory, hf generation tokens/s and the time to
publish one version, for a random-init model of a real shape (default Qwen2-0.5B's) on one GPU.

    python benchmarks/gpu_check.py [--shape qwen2_0_5b] [--steps 5] [--batch 16] [--seq-len 1024]
                                   [--gen-batch 32] [--gen-tokens 128] [--device cuda|cpu] [--peak-tflops X]

On a machine without a CUDA GPU it prints a line saying so and exits 0. ``--device cpu`` runs the same
measurements on the CPU (a smoke test: ``--shape random_25m --batch 2 --seq-len 64``).

The shape is a preset of ``configs/model/<name>.yaml`` (``model.init=random``, docs/models.md) or a path to such a
file; its model is made once (random weights, float32, safetensors, tidal's own tokenizer trained on a built-in
text) in ``--cache-dir`` and loaded with ``from_pretrained`` onto the GPU: as the learner holds it (fp32 parameters,
the optimizer's master copy, computing in bf16 under autocast) and, for generation, in bf16.

- learner: ``actors.learner.update.policy_gradient_step`` (the learner's own update: the default objective, a no-grad
  proximal forward and ``minibatches`` forward-backward passes, AdamW; ``--microbatch-tokens`` its
  ``max_tokens_per_microbatch``) on synthetic single-turn batches of ``--batch`` rows of ``--seq-len`` tokens, one
  warm-up update, then ``--steps`` timed ones.
- MFU: model FLOPs per update (6 N per token for the forward-backward, 2 N for the proximal forward; N the
  parameters of the linear layers, the LM head included; attention's own score FLOPs not counted) over the time,
  against the GPU's dense bf16 peak, looked up by its name (``--peak-tflops`` for another).
- peak memory: ``torch.cuda.max_memory_allocated`` over the learner's updates.
- generation: ``actors.rollout.hf_engine.sample`` of ``--gen-tokens`` tokens for ``--gen-batch`` prompts of 32 tokens.
- publish: serialising the learner's every parameter (fp32) to safetensors bytes on the host, exactly what
  ``streams.weights.weights_to_bytes`` does (the same call, repeated here because ``streams.weights`` imports trio;
  ``tests/models/test_random_models.py`` checks that the bytes are the same).

It imports torch, transformers, tokenizers, safetensors, numpy, pyarrow and PyYAML, and nothing of Ray, vLLM,
ZeroMQ or trio (a unit test checks). The last line is
``gpu=<name> learner_tokens_per_s=<n> mfu=<x> peak_mem_gib=<x> gen_tokens_per_s=<n> publish_s=<x>``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from actors.models.random_model import BUILTIN, ModelShape, ensure_random_model, parameter_count  # noqa: E402

# Dense bf16 tensor-core peaks (no sparsity), TFLOP/s, by a part of the device's name; the first match counts.
BF16_PEAK_TFLOPS = (("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.0), ("H200", 989.0), ("H800", 989.0),
                    ("B200", 2250.0), ("A100", 312.0), ("A800", 312.0), ("L40S", 362.0), ("L4", 121.0))
GIB = 2**30
PROMPT_TOKENS = 32  # generation prompts


def bf16_peak_tflops(device_name: str) -> float | None:
    return next((peak for part, peak in BF16_PEAK_TFLOPS if part in device_name), None)


def load_shape(name: str) -> ModelShape:
    """The ``shape`` of a ``model.init=random`` preset (``configs/model/<name>.yaml``) or of a YAML file; its
    tokenizer trained on the built-in text unless the file names an environment."""
    import yaml

    path = Path(name) if name.endswith((".yaml", ".yml")) else ROOT / "configs" / "model" / f"{name}.yaml"
    if not path.exists():
        presets = sorted(p.stem for p in (ROOT / "configs" / "model").glob("*.yaml"))
        raise SystemExit(f"gpu_check: no shape {name!r}; presets: {', '.join(presets)}")
    preset = yaml.safe_load(path.read_text())
    if preset.get("init") != "random" or "shape" not in preset:
        raise SystemExit(f"gpu_check: {path} is not a model.init=random preset (it has no init: random and shape)")
    shape = dict(preset["shape"])
    if shape.get("tokenizer_env") is None:
        shape["tokenizer_env"] = BUILTIN
    return ModelShape(**shape)


def linear_parameters(model) -> int:
    """N of the 6 N FLOPs per token: the weights of the linear layers (the LM head's too, tied or not)."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def serialise(model) -> bytes:
    """What ``streams.weights.weights_to_bytes`` does: every parameter once, detached, on the host, as safetensors."""
    from safetensors.torch import save

    return save({name: p.detach().cpu().contiguous() for name, p in model.named_parameters()})


@dataclass
class Completion:  # what single_turn_batch reads of a completion
    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]


def synthetic_batch(rows: int, seq_len: int, token_range: int, vocab_size: int, generator: torch.Generator):
    """Single-turn episodes of ``seq_len`` tokens (a quarter of them the action), returns +-1."""
    from actors.learner.batch import single_turn_batch

    action = max(1, seq_len // 4)
    ids = torch.randint(2, token_range, (rows, seq_len), generator=generator).tolist()
    behaviour = -math.log(vocab_size)  # about what a random-init model gives a token
    completions = [Completion(row[-action:], [behaviour] * action, [0] * action) for row in ids]
    returns = [1.0 if i % 2 else -1.0 for i in range(rows)]
    return single_turn_batch([row[:-action] for row in ids], completions, returns)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_learner(model, args, token_range: int, device: torch.device, compute_dtype: torch.dtype) -> dict:
    from actors.learner.update import Objective, ObjectiveState, policy_gradient_step

    objective, state = Objective(), ObjectiveState()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    generator = torch.Generator().manual_seed(0)
    batches = [synthetic_batch(args.batch, args.seq_len, token_range, model.config.vocab_size, generator)
               for _ in range(args.steps + 1)]

    def update(batch):  # the batch stays on the host: the update moves each micro-batch to the model's device
        return policy_gradient_step(model, optimizer, batch, objective, state, temperature=1.0, generator=generator,
                                    max_tokens_per_microbatch=args.microbatch_tokens, compute_dtype=compute_dtype)

    update(batches[0])  # warm-up: kernels chosen, optimizer state allocated
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    synchronize(device)
    started = time.perf_counter()
    for batch in batches[1:]:
        update(batch)
    synchronize(device)
    update_s = (time.perf_counter() - started) / args.steps
    tokens = args.batch * args.seq_len
    passes = 6 + (2 if objective.minibatches > 1 else 0)  # forward-backward, and the no-grad proximal forward
    return {"learner_tokens_per_s": tokens / update_s, "update_s": update_s,
            "flops_per_update": passes * linear_parameters(model) * tokens}


def measure_generation(model, args, token_range: int, eos_id: int, pad_id: int, device: torch.device) -> dict:
    from actors.rollout.sampling import sample

    generator = torch.Generator().manual_seed(1)
    prompts = torch.randint(2, token_range, (args.gen_batch, PROMPT_TOKENS), generator=generator).tolist()

    def generate(max_new_tokens: int):  # hf.sample puts its own tensors on the model's device
        return sample(model, prompts, eos_id=eos_id, pad_id=pad_id, max_new_tokens=max_new_tokens)

    generate(2)  # warm-up
    synchronize(device)
    started = time.perf_counter()
    samples = generate(args.gen_tokens)
    synchronize(device)
    elapsed = time.perf_counter() - started
    tokens = sum(len(s.tokens) for s in samples)
    return {"gen_tokens_per_s": tokens / elapsed, "gen_tokens": tokens, "gen_s": elapsed}


def measure_publish(model, rounds: int = 2) -> dict:
    times, size = [], 0
    for _ in range(rounds):
        started = time.perf_counter()
        size = len(serialise(model))
        times.append(time.perf_counter() - started)
    return {"publish_s": min(times), "publish_gib": size / GIB}


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="qwen2_0_5b", help="a model.init=random preset or a YAML file")
    parser.add_argument("--steps", type=int, default=5, help="timed learner updates (after one warm-up)")
    parser.add_argument("--batch", type=int, default=16, help="rows per update")
    parser.add_argument("--seq-len", type=int, default=1024, help="tokens per row")
    parser.add_argument("--microbatch-tokens", type=int, default=None, help="the learner's token budget per "
                        "micro-batch (default: one micro-batch per minibatch)")
    parser.add_argument("--gen-batch", type=int, default=32, help="prompts sampled at once")
    parser.add_argument("--gen-tokens", type=int, default=128, help="tokens sampled per prompt")
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:<i> or cpu (a smoke test)")
    parser.add_argument("--cache-dir", default="~/.cache/tidal/models", help="where the random model is kept")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the device's dense bf16 peak, if the "
                        "name lookup does not know it")
    args = parser.parse_args(argv)
    for name in ("steps", "batch", "seq_len", "gen_batch", "gen_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.microbatch_tokens is not None and args.microbatch_tokens < 1:
        parser.error("--microbatch-tokens must be >= 1")
    if args.seq_len < 2:
        parser.error("--seq-len must be >= 2 (a prompt token and an action token)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.device != "cpu" and not torch.cuda.is_available():
        print(f"gpu_check: no CUDA GPU on this machine (torch {torch.__version__}): nothing measured "
              "(--device cpu --shape random_25m runs the same measurements on the CPU)")
        return 0
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from actors.models.devices import resolve_device, resolve_dtype

    hf_logging.disable_progress_bar()
    device = resolve_device(args.device)
    dtype = resolve_dtype("auto", device)  # bf16 on a GPU, fp32 on the CPU
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    shape = load_shape(args.shape)
    started = time.perf_counter()
    path = ensure_random_model(args.cache_dir, shape)
    made_s = time.perf_counter() - started
    tokenizer = AutoTokenizer.from_pretrained(path)
    token_range = len(tokenizer)
    learner = AutoModelForCausalLM.from_pretrained(path).to(device).eval()  # fp32: the learner's master copy
    params = parameter_count(learner)
    print(f"gpu_check: {name}, {args.shape}: {params / 1e6:.1f} M parameters ({path}, made or found in "
          f"{made_s:.1f} s)", flush=True)

    result = measure_learner(learner, args, token_range, device, dtype)
    peak_mem = torch.cuda.max_memory_allocated(device) / GIB if device.type == "cuda" else math.nan
    result.update(measure_publish(learner))
    del learner
    if device.type == "cuda":
        torch.cuda.empty_cache()
    sampler = AutoModelForCausalLM.from_pretrained(path).to(device=device, dtype=dtype).eval()
    result.update(measure_generation(sampler, args, token_range, tokenizer.eos_token_id, tokenizer.pad_token_id,
                                     device))
    peak = args.peak_tflops or (bf16_peak_tflops(name) if device.type == "cuda" else None)
    achieved = result["flops_per_update"] / result["update_s"]
    mfu = achieved / (peak * 1e12) if peak else math.nan

    rows = [("device", name), ("shape", f"{args.shape} ({params / 1e6:.1f} M parameters)"),
            ("learner precision", f"fp32 parameters, {dtype} compute"),
            ("learner batch", f"{args.batch} x {args.seq_len} tokens, {args.steps} timed updates, micro-batches of "
                              f"{args.microbatch_tokens or 'a whole minibatch'} tokens"),
            ("learner update", f"{result['update_s']:.3f} s"),
            ("learner tokens/s", f"{result['learner_tokens_per_s']:.0f}"),
            ("model TFLOP/s", f"{achieved / 1e12:.1f}"),
            ("MFU", f"{mfu:.3f} of {peak:g} TFLOP/s bf16" if peak else "n/a (peak unknown: --peak-tflops)"),
            ("peak memory (learner)", f"{peak_mem:.2f} GiB" if not math.isnan(peak_mem) else "n/a (CPU)"),
            ("hf generation", f"{result['gen_tokens']} tokens ({args.gen_batch} x {args.gen_tokens}), {dtype} "
                              f"weights, in {result['gen_s']:.2f} s"),
            ("hf generation tokens/s", f"{result['gen_tokens_per_s']:.0f}"),
            ("publish one version", f"{result['publish_s']:.3f} s ({result['publish_gib']:.2f} GiB, fp32)")]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")
    print(f"gpu={name.replace(' ', '_')} learner_tokens_per_s={result['learner_tokens_per_s']:.0f} mfu={mfu:.4f} "
          f"peak_mem_gib={peak_mem:.2f} gen_tokens_per_s={result['gen_tokens_per_s']:.0f} "
          f"publish_s={result['publish_s']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
