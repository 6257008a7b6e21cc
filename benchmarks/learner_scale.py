"""The learner at a real size on the CPU: a group of ranks, micro-batches, and its overhead over plain torch.

    python benchmarks/learner_scale.py [--rows 32] [--rounds 3]

On a random-init model of ``--shape`` (default ``configs/model/random_25m.yaml``'s, 29.5 M parameters) and the
same synthetic batches:
- the weights after two updates on 2 gloo ranks (FSDP2) against 1 rank: the largest absolute difference;
- the weights after two updates with micro-batches of a small token budget against none (rows more than 2x apart
  in length still get passes of their own, ``actors/learner/microbatches.py``): the same;
- tidal's learner (``Trainer.update``: collate, advantages, decoupled PPO, statistics) against a plain torch loop
  doing the same work (one no-grad forward for the proximal policy, one forward-backward per minibatch, AdamW;
  tidal cuts a minibatch where row lengths differ over 2x, the plain loop pads it whole),
  action tokens per second, taking turns in one process;
- each rank's parameter, gradient and optimizer-state bytes with 2 ranks against 1.
Last line: ``params_m=<n> dp2_update_diff=<x> microbatch_diff=<x> learner_vs_plain=<x> dp2_state_mem_ratio=<x>``.

The weights' differences are fp32 rounding (another order of summation: gradients summed over ranks or over
micro-batches), amplified by AdamW where a gradient is near its epsilon (the update of such a weight is about
lr * g / (|g| + eps)): they grow with the learning rate. At ``--lr 5e-4`` (the tiny default job's) both are about
2e-5 for weights that moved 1e-3 to 2e-3; at 1e-5, a learning rate of RL at real sizes, about 4e-7.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actors.learner import local_group  # noqa: E402
from actors.models.random_model import ModelShape, ensure_random_model, parameter_count  # noqa: E402
from actors.learner.actor import LearnerConfig  # noqa: E402
from actors.learner.batch import collate  # noqa: E402
from actors.learner.group import Shard  # noqa: E402
from actors.learner.trainer import Trainer  # noqa: E402
from actors.learner.update import Objective, action_logprobs  # noqa: E402
from algos.losses import decoupled_ppo_loss, token_logprobs  # noqa: E402
from streams.schema import Columns, trajectory_table  # noqa: E402


def batch_table(seed: int, rows: int, vocab: int, prompt=(16, 48), action=(4, 16)):
    """Two-seat episodes of synthetic tokens, with behaviour log-probs a little off the policy's."""
    rng = random.Random(seed)
    out = []
    for i in range(rows):
        n, reward = rng.randint(*action), rng.choice([-1.0, 0.0, 1.0])
        out.append({Columns.EPISODE_ID: f"e{seed}-{i // 2}", Columns.ENV_NAME: "synthetic", Columns.SEED: 0,
                    Columns.TURN: i % 2, Columns.AGENT: i % 2, Columns.MATCHUP: "self", Columns.POLICY_ID: "main",
                    Columns.PROMPT_IDS: [rng.randrange(2, vocab) for _ in range(rng.randint(*prompt))],
                    Columns.ACTION_IDS: [rng.randrange(2, vocab) for _ in range(n)], Columns.ACTION_TEXT: "",
                    Columns.BEHAVIOUR_LOGPROBS: [-rng.uniform(5.5, 7.0) for _ in range(n)],
                    Columns.POLICY_VERSIONS: [0] * n, Columns.REWARD: reward, Columns.TERMINATED: True,
                    Columns.TRUNCATED: False, Columns.EPISODE_RETURN: reward,
                    Columns.INVALID_ACTION: False, Columns.CREATED_AT: 0.0, Columns.GENERATED_AT: 0.0,
                    Columns.SCORED_AT: 0.0})
    return trajectory_table(out)


def largest_difference(a: dict, b: dict) -> float:
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def state_bytes(memory: dict) -> int:
    return memory["param_bytes"] + memory["grad_bytes"] + memory["optimizer_bytes"]


class PlainLoop:
    """The same work as the learner's update, written directly in torch: the baseline of its overhead."""

    def __init__(self, model, cfg: LearnerConfig, pad_id: int):
        self.model, self.cfg, self.pad_id = model, cfg, pad_id
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)

    def update(self, table, version: int) -> None:
        objective = self.cfg.objective
        batch = collate(table, self.pad_id)
        returns = batch.returns
        advantages = (returns - returns.mean()) / (returns.std() + 1e-6)
        with torch.no_grad():
            proximal = action_logprobs(self.model, batch, self.cfg.temperature)
        order = torch.randperm(len(returns), generator=torch.Generator().manual_seed(version))
        self.model.train()
        for index in torch.chunk(order, objective.minibatches):
            rows = batch.rows(index).trimmed()
            logits = self.model(input_ids=rows.input_ids, attention_mask=rows.attention_mask).logits[:, :-1]
            logprobs = token_logprobs(logits, rows.input_ids[:, 1:], self.cfg.temperature)
            width = logprobs.shape[1]
            loss, _ = decoupled_ppo_loss(logprobs, proximal[index][:, :width], rows.behaviour_logprobs[:, 1:],
                                         advantages[index][:, None].expand_as(logprobs), rows.action_mask[:, 1:])
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), objective.max_grad_norm)
            self.optimizer.step()
        self.model.eval()


def throughput(cfg: LearnerConfig, tables: list, rounds: int) -> tuple[list[float], list[float]]:
    """Action tokens/s of tidal's learner and of the plain loop, taking turns on the same batches."""
    torch.set_num_threads(cfg.threads)
    tidal = Trainer(cfg, Shard())
    tidal.load(None)
    plain = PlainLoop(copy.deepcopy(tidal.model), cfg, tidal.tokenizer.pad_token_id)
    tokens = sum(sum(len(a) for a in t.column(Columns.ACTION_IDS).to_pylist()) for t in tables)
    rates = {"tidal": [], "plain": []}
    for round_ in range(rounds):
        for name in (("tidal", "plain") if round_ % 2 == 0 else ("plain", "tidal")):
            started = time.perf_counter()
            for version, table in enumerate(tables):
                if name == "tidal":
                    tidal.update(table, cfg.lr, version)
                else:
                    plain.update(table, version)
            rates[name].append(tokens / (time.perf_counter() - started))
        print(f"  round {round_ + 1}/{rounds}: tidal {rates['tidal'][-1]:.0f} tokens/s, "
              f"plain {rates['plain'][-1]:.0f} tokens/s", flush=True)
    return rates["tidal"], rates["plain"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=32, help="rows (turns) per batch")
    parser.add_argument("--rounds", type=int, default=3, help="turns of the throughput comparison")
    parser.add_argument("--budget", type=int, default=256, help="the small micro-batch token budget")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--lr", type=float, default=1e-5, help="AdamW's learning rate (RL at real sizes: 1e-6 to "
                        "1e-5; the weights' differences grow with it, see the module's docstring)")
    parser.add_argument("--cache-dir", default="~/.cache/tidal/models")
    args = parser.parse_args()
    shape = ModelShape(tokenizer_env="builtin")
    model_dir = ensure_random_model(args.cache_dir, shape)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    params = parameter_count(AutoModelForCausalLM.from_pretrained(model_dir))
    vocab = len(AutoTokenizer.from_pretrained(model_dir))
    print(f"model: {model_dir.name}, {params / 1e6:.1f} M parameters; {args.rows} rows a batch; lr {args.lr:g}",
          flush=True)
    cfg = LearnerConfig(model_path=str(model_dir), lr=args.lr, device="cpu", threads=args.threads, seed=0,
                        objective=Objective(minibatches=2, advantage="grpo"))
    tables = [batch_table(seed, args.rows, vocab) for seed in range(2)]

    started = time.perf_counter()
    one = local_group.train(cfg, 1, tables)
    two = local_group.train(cfg, 2, tables)
    dp2_diff = largest_difference(one["weights"], two["weights"])
    moved = largest_difference(one["weights"], local_group.train(cfg, 1, [])["weights"])
    if moved < args.lr:  # an AdamW step moves a weight by about lr
        raise SystemExit(f"the updates did not move the weights ({moved:.1e}): nothing to compare")
    memory_ratio = max(state_bytes(m) for m in two["memory"]) / state_bytes(one["memory"][0])
    print(f"2 gloo ranks vs 1: largest weight difference {dp2_diff:.2e} after two updates (which moved a weight "
          f"by up to {moved:.2e}); per-rank state "
          f"{[state_bytes(m) / 2**20 for m in two['memory']]} MiB vs {state_bytes(one['memory'][0]) / 2**20:.0f} MiB "
          f"({time.perf_counter() - started:.0f} s)", flush=True)

    started = time.perf_counter()
    cut = local_group.train(dataclasses.replace(cfg, max_tokens_per_microbatch=args.budget), 1, tables)
    micro_diff = largest_difference(one["weights"], cut["weights"])
    print(f"micro-batches of {args.budget} tokens ({cut['stats'][-1]['microbatches']} passes) vs no budget: "
          f"largest weight difference {micro_diff:.2e} ({time.perf_counter() - started:.0f} s)", flush=True)

    tidal, plain = throughput(cfg, tables, args.rounds)
    ratio = statistics.median(t / p for t, p in zip(tidal, plain))
    print(f"tidal's learner {statistics.median(tidal):.0f} tokens/s, plain torch {statistics.median(plain):.0f} "
          f"tokens/s (median of the rounds' ratios: {ratio:.3f})")
    print(f"params_m={params / 1e6:.1f} dp2_update_diff={dp2_diff:.2e} microbatch_diff={micro_diff:.2e} "
          f"learner_vs_plain={ratio:.3f} dp2_state_mem_ratio={memory_ratio:.3f}")


if __name__ == "__main__":
    main()
