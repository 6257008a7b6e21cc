"""The GPU check, one command: learner tokens/s and MFU, peak memory, hf generation tokens/s and the time to
publish one version, for a random-init model of a real shape (default Qwen2-0.5B's) on one GPU; with ``--loop``, the
default job's whole actor loop on that GPU too.

    python benchmarks/gpu_check.py [--shape qwen2_0_5b] [--steps 5] [--batch 16] [--seq-len 1024]
                                   [--gen-batch 32] [--gen-tokens 128] [--device cuda|cuda:<i>|cpu]
                                   [--peak-tflops X] [--loop [--loop-versions 3] [overrides...]]

On a machine without a CUDA GPU it prints a line saying so and exits 0. ``--device cpu`` runs the same
measurements on the CPU, with defaults that finish in a minute or two there (``CPU_DEFAULTS``: the
``random_25m`` shape, 2 rows of 64 tokens).

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
- generation: ``actors.rollout.sampling.sample`` of ``--gen-tokens`` tokens for ``--gen-batch`` prompts of 32 tokens,
  drawing from a seeded generator on the device, as the rollout actor's sampler does (``measure_generation``).
- publish: serialising the learner's every parameter (fp32) to safetensors bytes on the host, exactly what
  ``streams.weights.weights_to_bytes`` does (the same call, repeated here because ``streams.weights`` imports trio;
  ``tests/models/test_random_models.py`` checks that the bytes are the same).
- ``--loop``: ``tidal launch``'s default job (TicTacToe, configs/launch.yaml) run as the launcher runs it
  (``actors.cli.load_config`` and ``launch``), every actor on one trio loop in this process (``run.mode=local``, no
  Ray), rollout and learner on ``--device``, with the ``--shape`` preset's random model, until ``--loop-versions``
  learner versions; no evaluation games; Hydra ``overrides`` after the options change that job (e.g.
  ``replay.args.batch_episodes=32``, or ``model.shape.layers=2`` for a smaller model). Its versions/s, episodes/s and sampled tokens/s over the training time and
  the learner's busy fraction come from the run's own metrics (``metrics.jsonl``, ``summary.json``).

Without ``--loop`` it imports torch, transformers, tokenizers, safetensors, numpy, pyarrow and PyYAML, and nothing of
Ray, vLLM, ZeroMQ or trio (a unit test checks); ``--loop`` imports what a local run does (trio, ZeroMQ, Hydra; no
Ray). ``benchmarks/gpu_kit_packages.txt`` lists what either imports beyond what a bare GPU machine has (a test
checks the list against the imports). The last line is ``gpu=<name> learner_tokens_per_s=<n> mfu=<x>
peak_mem_gib=<x> gen_tokens_per_s=<n> publish_s=<x>``, followed with ``--loop`` by ``loop_versions_per_s=<x>
loop_episodes_per_s=<x> loop_gen_tokens_per_s=<n> loop_learner_busy=<x>``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from actors.models.random_model import BUILTIN, ModelShape, ensure_random_model, parameter_count  # noqa: E402

# Dense bf16 tensor-core peaks (no sparsity), TFLOP/s, by a part of the device's name (NVIDIA's data sheets give
# twice these, with sparsity). A name holds several parts ("NVIDIA L40S" holds "L40S", "L40" and "L4"; "NVIDIA H200
# NVL" holds "H200 NVL" and "H200"): the longest part found counts.
BF16_PEAK_TFLOPS = {"H100 PCIe": 756.0, "H100 NVL": 835.0, "H100": 989.0, "H200 NVL": 835.0, "H200": 989.0,
                    "H800": 989.0, "B200": 2250.0, "A100": 312.0, "A800": 312.0, "L40S": 362.0, "L40": 181.0,
                    "L4": 121.0}
GIB = 2**30
PROMPT_TOKENS = 32  # generation prompts
# What the options default to on a GPU, and on the CPU (--device cpu): the same measurements at a size that ends in a
# minute or two on a couple of cores
GPU_DEFAULTS = {"shape": "qwen2_0_5b", "steps": 5, "batch": 16, "seq_len": 1024, "gen_batch": 32, "gen_tokens": 128}
CPU_DEFAULTS = {"shape": "random_25m", "steps": 2, "batch": 2, "seq_len": 64, "gen_batch": 4, "gen_tokens": 16}
LOOP_MINUTES = 30.0  # --loop's budget: it stops at --loop-versions versions, or fails saying how far it got


def bf16_peak_tflops(device_name: str) -> float | None:
    """The dense bf16 peak of the GPU called ``device_name`` (``torch.cuda.get_device_name``), None if unknown."""
    parts = [part for part in BF16_PEAK_TFLOPS if part in device_name]
    return BF16_PEAK_TFLOPS[max(parts, key=len)] if parts else None


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
    """hf generation as the rollout actor samples: `sample` drawing from one seeded generator made by
    `device_generator` on the actor's device as ``resolve_device`` gives it (``--device cuda``: ``cuda``, no index,
    as ``rollout.args.device=cuda`` or ``auto`` gives), passed as ``generator=``: what ``HfSampler.sample_pass``
    does. ``HfSampler`` itself is not used because ``actors.rollout.hf_engine`` imports trio, which the plain check
    does without; on a GPU this is the path where a generator on the wrong device fails."""
    from actors.rollout.sampling import device_generator, sample

    prompts = torch.randint(2, token_range, (args.gen_batch, PROMPT_TOKENS),
                            generator=torch.Generator().manual_seed(1)).tolist()
    generator = device_generator(device, seed=1)

    def generate(max_new_tokens: int):  # sample puts its own tensors on the model's device
        return sample(model, prompts, eos_id=eos_id, pad_id=pad_id, max_new_tokens=max_new_tokens,
                      generator=generator)

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


def loop_overrides(args, out: str) -> list[str]:
    """The default job as ``tidal launch`` would be told it: in one process (``run.mode=local``), rollout and learner
    on ``--device``, the ``--shape`` preset's random model, until ``--loop-versions`` versions; no evaluation games
    (they would time the evaluation, and the learning curve they plot imports matplotlib); then the command line's
    own ``overrides``. Its tokenizer is trained on the built-in text, as the measurements' model is: one model made,
    not two (2 GB each at the 0.5B shape)."""
    return ["run.mode=local", f"model={args.shape}", f"model.shape.tokenizer_env={BUILTIN}",
            f"model.cache_dir={args.cache_dir}", f"rollout.args.device={args.device}",
            f"learner.args.device={args.device}", f"run.max_versions={args.loop_versions}",
            f"run.minutes={LOOP_MINUTES}", "run.log_every_s=1", "run.progress=false", "eval.every_s=0",
            "eval.endpoint_games_per_seat=0", f"run.dir={out}", "run.name=loop", *args.overrides]


def measure_loop(args) -> dict:
    """The default job's actor loop on the device, run by the launcher's own ``load_config`` and ``launch``; its
    figures from the run's metrics rows and summary (``loop_figures``). The run directory is a temporary one."""
    from actors.cli import launch, load_config

    with tempfile.TemporaryDirectory(prefix="gpu_check-loop-") as out:
        summary = launch(load_config(loop_overrides(args, out)))
        with open(Path(summary["run_dir"]) / "metrics.jsonl") as metrics:
            rows = [json.loads(line) for line in metrics]
    return loop_figures(summary, rows, args.loop_versions)


def loop_figures(summary: dict, rows: list[dict], versions: int) -> dict:
    """Rates over the loop's training time, from its last metrics row: its totals (versions, episodes, tokens
    sampled) count from the start of training, there being no evaluation games, and ``elapsed_s`` is the time
    since then; the learner's busy fraction is the run's own (training time over the time since its first batch).
    A short loop's rates include the filling of the first batch."""
    last = rows[-1] if rows else {"version": 0}
    if summary["interrupted"] or last["version"] < versions:
        raise SystemExit(f"gpu_check: the loop reached version {last['version']} of {versions} "
                         f"({'interrupted' if summary['interrupted'] else f'in its {LOOP_MINUTES:g} minutes'}); "
                         f"its run directory was {summary['run_dir']}")
    seconds = last["elapsed_s"]
    return {"loop_versions": last["version"], "loop_s": seconds, "loop_episodes": last["episodes"],
            "loop_tokens": last["tokens"], "loop_versions_per_s": last["version"] / seconds,
            "loop_episodes_per_s": last["episodes"] / seconds, "loop_gen_tokens_per_s": last["tokens"] / seconds,
            "loop_learner_busy": summary["learner_busy"]}


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    gpu, cpu = GPU_DEFAULTS, CPU_DEFAULTS

    def default(name: str) -> str:
        return f"default {gpu[name]}, on the CPU {cpu[name]}"

    parser.add_argument("--shape", help=f"a model.init=random preset or a YAML file ({default('shape')})")
    parser.add_argument("--steps", type=int, help=f"timed learner updates, after one warm-up ({default('steps')})")
    parser.add_argument("--batch", type=int, help=f"rows per update ({default('batch')})")
    parser.add_argument("--seq-len", type=int, help=f"tokens per row ({default('seq_len')})")
    parser.add_argument("--microbatch-tokens", type=int, default=None, help="the learner's token budget per "
                        "micro-batch (default: one micro-batch per minibatch)")
    parser.add_argument("--gen-batch", type=int, help=f"prompts sampled at once ({default('gen_batch')})")
    parser.add_argument("--gen-tokens", type=int, help=f"tokens sampled per prompt ({default('gen_tokens')})")
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:<i> or cpu (a smoke test)")
    parser.add_argument("--cache-dir", default="~/.cache/tidal/models", help="where the random model is kept")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the device's dense bf16 peak, if the "
                        "name lookup does not know it")
    parser.add_argument("--loop", action="store_true", help="then run the default job's actor loop on the device "
                        "(run.mode=local) with the shape's random model")
    parser.add_argument("--loop-versions", type=int, default=3, help="learner versions the loop runs (default 3)")
    parser.add_argument("overrides", nargs="*", help="--loop: Hydra overrides of its job, after gpu_check's own "
                        "(e.g. replay.args.batch_episodes=32)")
    args = parser.parse_args(argv)
    for name, value in (CPU_DEFAULTS if args.device == "cpu" else GPU_DEFAULTS).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for name in ("steps", "batch", "seq_len", "gen_batch", "gen_tokens", "loop_versions"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.microbatch_tokens is not None and args.microbatch_tokens < 1:
        parser.error("--microbatch-tokens must be >= 1")
    if args.seq_len < 2:
        parser.error("--seq-len must be >= 2 (a prompt token and an action token)")
    if args.overrides and not args.loop:
        parser.error(f"overrides ({' '.join(args.overrides)}) change the --loop's job: add --loop")
    if args.loop and args.shape.endswith((".yaml", ".yml")):
        parser.error(f"--loop runs the job with model=<preset>: --shape must name a preset of configs/model/, not "
                     f"the file {args.shape}")
    return args


def measure(args, name: str, device: torch.device, dtype: torch.dtype) -> dict:
    """The shape's model made (or found), then the learner's updates, publishing and generation measured on it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    path = ensure_random_model(args.cache_dir, load_shape(args.shape))
    made_s = time.perf_counter() - started
    tokenizer = AutoTokenizer.from_pretrained(path)
    token_range = len(tokenizer)
    learner = AutoModelForCausalLM.from_pretrained(path).to(device).eval()  # fp32: the learner's master copy
    params = parameter_count(learner)
    print(f"gpu_check: {name}, {args.shape}: {params / 1e6:.1f} M parameters ({path}, made or found in "
          f"{made_s:.1f} s)", flush=True)
    result = {"params": params, **measure_learner(learner, args, token_range, device, dtype)}
    result["peak_mem_gib"] = torch.cuda.max_memory_allocated(device) / GIB if device.type == "cuda" else math.nan
    result.update(measure_publish(learner))
    del learner
    if device.type == "cuda":
        torch.cuda.empty_cache()
    sampler = AutoModelForCausalLM.from_pretrained(path).to(device=device, dtype=dtype).eval()
    result.update(measure_generation(sampler, args, token_range, tokenizer.eos_token_id, tokenizer.pad_token_id,
                                     device))
    return result


def report(args, name: str, dtype: torch.dtype, result: dict) -> None:
    """The table, then the last line: every figure, ``key=value``."""
    peak = args.peak_tflops or (bf16_peak_tflops(name) if name != "cpu" else None)
    achieved = result["flops_per_update"] / result["update_s"]
    mfu = achieved / (peak * 1e12) if peak else math.nan
    peak_mem = result["peak_mem_gib"]
    rows = [("device", name), ("shape", f"{args.shape} ({result['params'] / 1e6:.1f} M parameters)"),
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
    line = (f"gpu={name.replace(' ', '_')} learner_tokens_per_s={result['learner_tokens_per_s']:.0f} mfu={mfu:.4f} "
            f"peak_mem_gib={peak_mem:.2f} gen_tokens_per_s={result['gen_tokens_per_s']:.0f} "
            f"publish_s={result['publish_s']:.3f}")
    if args.loop:
        rows += [("loop (default job)", f"{result['loop_versions']} versions, {result['loop_episodes']} episodes, "
                                        f"{result['loop_tokens']} tokens sampled in {result['loop_s']:.1f} s of "
                                        f"training (run.mode=local)"),
                 ("loop versions/s", f"{result['loop_versions_per_s']:.3f}"),
                 ("loop episodes/s", f"{result['loop_episodes_per_s']:.1f}"),
                 ("loop generation tokens/s", f"{result['loop_gen_tokens_per_s']:.0f}"),
                 ("loop learner busy", f"{result['loop_learner_busy']:.2f}")]
        line += (f" loop_versions_per_s={result['loop_versions_per_s']:.4f} "
                 f"loop_episodes_per_s={result['loop_episodes_per_s']:.2f} "
                 f"loop_gen_tokens_per_s={result['loop_gen_tokens_per_s']:.0f} "
                 f"loop_learner_busy={result['loop_learner_busy']:.3f}")
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")
    print(line)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.device != "cpu" and not torch.cuda.is_available():
        print(f"gpu_check: no CUDA GPU on this machine (torch {torch.__version__}): nothing measured "
              "(--device cpu runs the same measurements on the CPU, with a small shape)")
        return 0
    from transformers.utils import logging as hf_logging

    from actors.models.devices import resolve_device, resolve_dtype

    hf_logging.disable_progress_bar()
    device = resolve_device(args.device)
    dtype = resolve_dtype("auto", device)  # bf16 on a GPU, fp32 on the CPU
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    result = measure(args, name, device, dtype)
    if args.loop:
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the measurements' models are gone: the loop's actors load their own
        print(f"gpu_check: the default job's loop, {args.loop_versions} versions on {args.device} ...", flush=True)
        result.update(measure_loop(args))
    report(args, name, dtype, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
