"""Micro-batches by length, and rows with no gradient: what the learner computed for nothing.

    python research/padding.py [--rounds 3] [--rows 320] [--long-share 0.2] [--idle-share 0.5]

A role game mixes rows of very different lengths in one minibatch: in ``propose_solve`` a proposer's row (its
prompt shows earlier tasks) is about 230 tokens, a solver's about 60, one proposer to four solvers. Padded all to
the longest, a minibatch costs the learner about three times its tokens. ``actors/learner/microbatches.py`` starts a
new micro-batch wherever a row is at most half its micro-batch's longest (``MAX_SPREAD``).

On the tiny model's shape (``configs/model/tiny.yaml``, random weights) and one synthetic batch of those lengths,
the learner's update (``policy_gradient_step``: the recipe's two minibatches, the proximal pass, decoupled PPO)
with the rule and without it (``MAX_SPREAD`` infinite: one pass a minibatch, as before), taking turns for
``--rounds`` rounds. Then the rollout's side (``hf`` sampling, 16 new tokens): half as many prompts of those
lengths in one left-padded pass, and in passes of lengths within 2x, as ``actors.rollout.hf_engine.passes`` now cuts them.
Last line: ``length_split_speedup=<x> one_pass_s=<s> split_s=<s> update_diff=<x> generation_split_speedup=<x>``:
the median time of an update without the rule over with it, the largest weight difference after one update of
each from the same weights (rounding only: the cut does not change the update), and the median ratio of the
sampling times.

Then the rows with no gradient: the same batch with ``--idle-share`` of its rows at advantage 0 (GRPO groups whose
attempts all scored alike), updated computing them (as before) and leaving them out
(``microbatches.trained_rows``), taking turns: ``idle_skip_speedup`` (the median time computing every row over
leaving the idle ones out) and ``idle_update_diff`` (the largest weight difference: rounding only) end the last
line.
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

from actors.learner import microbatches  # noqa: E402
from actors.models import padding  # noqa: E402
from actors.learner.batch import single_turn_batch  # noqa: E402
from actors.learner.update import Objective, ObjectiveState, policy_gradient_step  # noqa: E402


def mixed_prompts(rows: int, long_share: float, vocab: int, seed: int = 0) -> list[list[int]]:
    """``long_share`` of them proposer-like (205 to 225 tokens), the rest solver-like (40 to 60)."""
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(205, 225) if rng.random() < long_share
                                                     else rng.randint(40, 60))] for _ in range(rows)]


def mixed_batch(rows: int, long_share: float, vocab: int, seed: int = 0, returns: list[float] | None = None):
    """``rows`` one-turn rows of ``mixed_prompts`` and actions of 8 to 20 tokens."""
    rng = random.Random(seed + 1)
    completions = []
    for _ in range(rows):
        n = rng.randint(8, 20)
        completions.append(SimpleNamespace(token_ids=[rng.randrange(3, vocab) for _ in range(n)],
                                           logprobs=[-rng.uniform(1.0, 4.0) for _ in range(n)], versions=[0] * n))
    return single_turn_batch(mixed_prompts(rows, long_share, vocab, seed), completions,
                             returns or [float(rng.random() < 0.3) for _ in range(rows)])


def tiny_model(vocab: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                                        pad_token_id=0))


def update(model, batch, spread: float, advantage: str = "grpo") -> tuple[float, int]:
    """One update with ``MAX_SPREAD = spread``: (seconds, micro-batches)."""
    padding.MAX_SPREAD = spread
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    start = time.perf_counter()
    stats = policy_gradient_step(model, optimizer, batch, Objective(minibatches=2, advantage=advantage),
                                 ObjectiveState(), temperature=1.0, version=0,
                                 generator=torch.Generator().manual_seed(0))
    return time.perf_counter() - start, stats["microbatches"]


def generation_times(model, prompts: list[list[int]], max_new_tokens: int) -> tuple[float, float]:
    """Seconds to sample every prompt in one padded pass, and in passes of lengths within 2x (as the rollout
    actor's ``_generate`` groups them)."""
    from actors.rollout.sampling import sample
    from actors.models.padding import cut

    lengths = [len(p) for p in prompts]
    longest_first = sorted(range(len(prompts)), key=lambda i: -lengths[i])
    times = []
    for groups in ([list(range(len(prompts)))], cut(longest_first, lengths, None)):
        start = time.perf_counter()
        for group in groups:
            sample(model, [prompts[i] for i in group], eos_id=1, pad_id=0, max_new_tokens=max_new_tokens,
                   generator=torch.Generator().manual_seed(0))
        times.append(time.perf_counter() - start)
    return times[0], times[1]


def idle_rows(base, args, vocab: int) -> str:
    """Updates on a batch with ``args.idle_share`` of its rows at advantage 0 (``grpo_mean`` over returns of mean
    0: the idle rows return 0, the others +1 and -1 in turn), computing every row and leaving the idle ones out."""
    rng = random.Random(2)
    active = [i for i in range(args.rows) if rng.random() >= args.idle_share]
    returns = [0.0] * args.rows
    for k, i in enumerate(active[:len(active) // 2 * 2]):  # an even count of them, so that the mean is exactly 0
        returns[i] = -1.0 if k % 2 else 1.0
    batch, default = mixed_batch(args.rows, args.long_share, vocab, returns=returns), microbatches.trained_rows
    times, weights = {"every row": [], "trained rows": []}, {}
    every_row = lambda _objective, advantages, *_: torch.ones_like(advantages, dtype=torch.bool)  # noqa: E731
    for round_ in range(args.rounds):
        for name in times:
            microbatches.trained_rows = default if name == "trained rows" else every_row
            model = copy.deepcopy(base)
            seconds, passes = update(model, batch, padding.MAX_SPREAD, advantage="grpo_mean")
            times[name].append(seconds)
            weights[name] = model
            print(f"round {round_ + 1}: {name} ({returns.count(0.0)} of {len(returns)} idle): {seconds:.2f} s, "
                  f"{passes} passes")
    microbatches.trained_rows = default
    diff = max((a - b).abs().max().item() for a, b in zip(*(m.parameters() for m in weights.values())))
    every, trained = (statistics.median(t) for t in times.values())
    return f"idle_skip_speedup={every / trained:.2f} idle_update_diff={diff:.1e}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", type=int, default=320, help="rows of the batch (the recipe: 64 episodes x 5)")
    parser.add_argument("--long-share", type=float, default=0.2, help="share of long (proposer-like) rows")
    parser.add_argument("--idle-share", type=float, default=0.5, help="share of rows with advantage 0")
    args = parser.parse_args()
    torch.set_num_threads(1)  # the learner's default (learner.args.threads)
    vocab, default = 320, padding.MAX_SPREAD
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
    padding.MAX_SPREAD = default
    prompts = mixed_prompts(args.rows // 2, args.long_share, vocab, seed=1)  # a rollout batch: about 32 episodes' asks
    generation = [generation_times(base, prompts, 16) for _ in range(args.rounds)]
    for round_, (whole, split) in enumerate(generation):
        print(f"round {round_ + 1}: generation of {len(prompts)} prompts: one pass {whole:.2f} s, by length {split:.2f} s")
    diff = max((a - b).abs().max().item() for a, b in zip(weights["one pass"].parameters(),
                                                          weights["split"].parameters()))
    one, split = statistics.median(times["one pass"]), statistics.median(times["split"])
    gen = statistics.median(whole / split for whole, split in generation)
    idle = idle_rows(base, args, vocab)
    print(f"length_split_speedup={one / split:.2f} one_pass_s={one:.2f} split_s={split:.2f} update_diff={diff:.1e} "
          f"generation_split_speedup={gen:.2f} {idle}")


if __name__ == "__main__":
    main()
