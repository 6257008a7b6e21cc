"""Why the Kuhn Poker main agent stays card-blind: two cheap probes, no league run (a few minutes on a CPU).

    python research/kuhn_card_probe.py [--steps N] [--lr X] [hydra overrides of configs/league.yaml...]

1. ``signal``: exact action values (no sampling) of a card-blind learner betting/calling with probability q at
   every information state, against the main agent's training mix of league.yaml (self-play 0.35, random and
   the equilibrium player 0.075 each, snapshots 0.5, taken as card-blind like itself): the advantage of
   bet/call over check/fold at each of the 12 information states. Card-dependent play pays where these differ
   by card.
2. ``rl``: the league's base model trained on the exact policy gradient of those advantages (sum over the 12
   states of A * p(1-p) * grad log p, the expected REINFORCE step with no noise) at the league's lr: does its
   policy become card-dependent?
3. ``ce``: the same model trained with cross-entropy towards a card-dependent target (bet/call 0.1 with J, 0.5
   with Q, 0.9 with K) at the same lr: can it condition on its card at all?
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.league import kuhn_prompt  # noqa: E402 (the league benchmark's prompt of an information state)

from actors.models.base_model import ensure_base_model, load_policy, tiny_model_config  # noqa: E402
from actors.cli import load_config  # noqa: E402

TERMINAL = {"pp": lambda w: w, "pbp": lambda w: -1, "pbb": lambda w: 2 * w, "bp": lambda w: 1, "bb": lambda w: 2 * w}
EQUILIBRIUM = {("", 0): 1 / 3, ("", 1): 0.0, ("", 2): 1.0, ("pb", 0): 0.0, ("pb", 1): 2 / 3, ("pb", 2): 1.0,
               ("b", 0): 0.0, ("b", 1): 1 / 3, ("b", 2): 1.0, ("p", 0): 1 / 3, ("p", 1): 0.0, ("p", 2): 1.0}
STATES = [f"{card}{history}" for card in range(3) for history in ("", "p", "b", "pb")]  # OpenSpiel's names


def value(cards, history, policies, seat) -> float:
    """``seat``'s expected return from ``history``; policies[player](card, history) = p(bet/call)."""
    if history in TERMINAL:
        v = TERMINAL[history](1 if cards[0] > cards[1] else -1)
        return v if seat == 0 else -v
    player = len(history) % 2
    q = policies[player](cards[player], history)
    return q * value(cards, history + "b", policies, seat) + (1 - q) * value(cards, history + "p", policies, seat)


def advantages(learner, opponent) -> dict[str, float]:
    """Q(bet/call) - Q(check/fold) at each of the learner's information states, over the opponent's cards
    weighted by the opponent's probability of reaching the state."""
    out = {}
    for state in STATES:
        card, history = int(state[0]), state[1:]
        seat = len(history) % 2
        diff = reach = 0.0
        for other in (c for c in range(3) if c != card):
            cards = [card, other] if seat == 0 else [other, card]
            policies = [learner, opponent] if seat == 0 else [opponent, learner]
            r = 1.0
            for i, a in enumerate(history):
                if i % 2 != seat:
                    p = policies[i % 2](cards[i % 2], history[:i])
                    r *= p if a == "b" else 1 - p
            diff += r * (value(cards, history + "b", policies, seat) - value(cards, history + "p", policies, seat))
            reach += r
        out[state] = diff / reach
    return out


def training_mix_advantages(q: float) -> dict[str, float]:
    blind = lambda card, history: q  # noqa: E731
    parts = [(0.85, blind), (0.075, lambda c, h: 0.5), (0.075, lambda c, h: EQUILIBRIUM[(h, c)])]
    total = dict.fromkeys(STATES, 0.0)
    for weight, opponent in parts:
        for state, a in advantages(blind, opponent).items():
            total[state] += weight * a
    return total


def name(state: str) -> str:
    return "JQK"[int(state[0])] + ":" + (state[1:] or "-")


def train(model, tokenizer, lr: float, steps: int, objective: str, targets: dict[str, float]) -> None:
    """``rl``: the exact policy-gradient step on ``targets`` (advantages); ``ce``: cross-entropy towards them
    (probabilities of bet/call)."""
    encoded = {}
    for state in STATES:
        prompt, moves = kuhn_prompt(state)  # moves: [check or fold, bet or call]
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        encoded[state] = [(ids, tokenizer(m, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])
                          for m in moves]

    def log_probs(state):
        scores = []
        for prompt, answer in encoded[state]:
            logits = model(torch.tensor([prompt + answer])).logits[0, len(prompt) - 1:-1].float()
            scores.append(torch.log_softmax(logits, -1).gather(1, torch.tensor(answer)[:, None]).sum())
        return torch.log_softmax(torch.stack(scores), 0)  # normalised over the two legal moves

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    started = time.time()
    for step in range(steps + 1):
        loss, probs = 0.0, {}
        for state in STATES:
            lp = log_probs(state)
            p = lp[1].exp()
            probs[state] = float(p.detach())
            if objective == "rl":
                loss = loss - targets[state] * p.detach() * (1 - p.detach()) * lp[1]
            else:
                loss = loss - (targets[state] * lp[1] + (1 - targets[state]) * lp[0])
        if step % 20 == 0:
            print(f"  {objective} step {step:3d} ({time.time() - started:4.0f} s): p(bet/call) "
                  + " ".join(f"{name(s)}={probs[s]:.2f}" for s in STATES), flush=True)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--lr", type=float, default=None, help="default: the league's learner.args.lr")
    args, overrides = parser.parse_known_args(argv)
    cfg = load_config(overrides, "league")
    lr = args.lr or cfg.learner.args.lr
    torch.set_num_threads(1)
    torch.manual_seed(0)
    print("signal: A(bet/call) - A(check/fold) of a card-blind learner against the main agent's training mix")
    for q in (0.5, 0.9, 0.97):
        a = training_mix_advantages(q)
        mean = sum(a.values()) / len(a)
        print(f"  q={q}: " + " ".join(f"{name(s)}={a[s]:+.2f}" for s in STATES) + f"  (mean {mean:+.2f})")
    base = Path(cfg.model.path) if cfg.model.path else \
        ensure_base_model(cfg.model.cache_dir, tiny_model_config(cfg))
    for objective, targets in (("rl", training_mix_advantages(0.5)),
                               ("ce", {s: (0.1, 0.5, 0.9)[int(s[0])] for s in STATES})):
        model, tokenizer = load_policy(str(base))
        model.train()
        print(f"{objective}: the base model {base.name}, lr {lr:g}")
        train(model, tokenizer, lr, args.steps, objective, targets)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
