"""Micro-batches by length: what padding every row of a minibatch to its longest costs the learner.

    python benchmarks/padding.py [--rounds 3] [--rows 320] [--long-share 0.2]

A role game mixes rows of very different lengths in one minibatch: in ``propose_solve`` a proposer's row (its
prompt shows earlier tasks) is about 230 tokens, a solver's about 60, one proposer to four solvers. Padded all to
the longest, a minibatch costs the learner about three times its tokens. ``actors/microbatches.py`` starts a
new micro-batch wherever a row is at most half its micro-batch's longest (``MAX_SPREAD``).

On the tiny model's shape (``configs/model/tiny.yaml``, random weights) and one synthetic batch of those lengths,
the learner's update (``policy_gradient_step``: the recipe's two minibatches, the proximal pass, decoupled PPO)
with the rule and without it (``MAX_SPREAD`` infinite: one pass a minibatch, as before), taking turns for
``--rounds`` rounds. Last line: ``length_split_speedup=<x> one_pass_s=<s> split_s=<s> update_diff=<x>``, the
median time of an update without the rule over with it, and the largest weight difference after one update of
each from the same weights (rounding only: the cut does not change the update).
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actors import microbatches  # noqa: E402
from actors.training import Objective, TrainerState, policy_gradient_step, single_turn_batch  # noqa: E402


def mixed_batch(rows: int, long_share: float, vocab: int, seed: int = 0):
    """``rows`` one-turn rows: ``long_share`` of them proposer-like (about 215 prompt and 15 action tokens), the
    rest solver-like (about 50 and 13)."""
    rng = random.Random(seed)
    prompts, completions = [], []
    for _ in range(rows):
        long = rng.random() < long_share
        prompts.append([rng.randrange(3, vocab) for _ in range(rng.randint(205, 225) if long else rng.randint(40, 60))])
        n = rng.randint(8, 20)
        completions.append(SimpleNamespace(token_ids=[rng.randrange(3, vocab) for _ in range(n)],
                                           logprobs=[-rng.uniform(1.0, 4.0) for _ in range(n)], versions=[0] * n))
    return single_turn_batch(prompts, completions, [float(rng.random() < 0.3) for _ in range(rows)])


def tiny_model(vocab: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                                        pad_token_id=0))


def update(model, batch, spread: float) -> tuple[float, int]:
    """One update with ``MAX_SPREAD = spread``: (seconds, micro-batches)."""
    microbatches.MAX_SPREAD = spread
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    start = time.perf_counter()
    stats = policy_gradient_step(model, optimizer, batch, Objective(minibatches=2, advantage="grpo"), TrainerState(),
                                 temperature=1.0, version=0, generator=torch.Generator().manual_seed(0))
    return time.perf_counter() - start, stats["microbatches"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", type=int, default=320, help="rows of the batch (the recipe: 64 episodes x 5)")
    parser.add_argument("--long-share", type=float, default=0.2, help="share of long (proposer-like) rows")
    args = parser.parse_args()
    torch.set_num_threads(1)  # the learner's default (learner.args.threads)
    vocab, default = 320, microbatches.MAX_SPREAD
    batch, base = mixed_batch(args.rows, args.long_share, vocab), tiny_model(vocab)
    times = {"one pass": [], "split": []}
    weights = {}
    update(copy.deepcopy(base), batch, default)  # warm-up, untimed
    for round_ in range(args.rounds):
        for name, spread in (("one pass", float("inf")), ("split", default)):
            model = copy.deepcopy(base)
            seconds, passes = update(model, batch, spread)
            times[name].append(seconds)
            weights[name] = model
            print(f"round {round_ + 1}: {name}: {seconds:.2f} s, {passes} passes")
    microbatches.MAX_SPREAD = default
    diff = max((a - b).abs().max().item() for a, b in zip(weights["one pass"].parameters(),
                                                          weights["split"].parameters()))
    one, split = statistics.median(times["one pass"]), statistics.median(times["split"])
    print(f"length_split_speedup={one / split:.2f} one_pass_s={one:.2f} split_s={split:.2f} update_diff={diff:.1e}")


if __name__ == "__main__":
    main()
