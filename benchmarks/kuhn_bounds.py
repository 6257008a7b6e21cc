"""What the league benchmark's two Kuhn Poker targets allow together: exact, no model involved.

    python benchmarks/kuhn_bounds.py [--bound 0.1] [--seed 0] [--quick]

The league benchmark asks for a main agent with NashConv <= 0.1 that wins >= 0.6 of its hands against the
uniformly random player. This prints, exactly (OpenSpiel over every deal and move):

- the equilibrium family's (alpha in 0, 1/6, 1/3; envs/opponents.py) win rate and chips a hand against random:
  the equilibrium wins at most half its hands against random (it wins chips: folding J, calling with K);
- the most any policy with NashConv <= bound wins against random: a differential-evolution search (SciPy) over
  the 12 probabilities of betting or calling, with the NashConv excess as a penalty; the policy it found;
- the least NashConv of a policy that plays a card the same way in both seats (one probability for opening,
  one for facing a bet, per card): what a model that ignores its seat and the history can reach;
- with ``--magnet league.json`` (a league benchmark's report: its base model's move table), the fixed point of
  the KL-regularised update towards that magnet (``kl_estimator=reward``): at every information state
  pi(a) proportional to magnet(a) * exp(Q(a) / alpha), Q its counterfactual values, iterated with damping; its
  NashConv for each alpha in ``--alphas``.

Last line:

    equilibrium_vs_random=<best of the family> max_vs_random_at_nash_conv_<bound>=<win rate>
    seat_blind_min_nash_conv=<x>

(one line; wrapped here)

`--quick`: a short search (a few seconds; the search's numbers are then lower bounds only).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from league import exact_vs_random, opponent_probabilities, tabular_policy  # noqa: E402 (benchmarks/league.py)

from envs.opponents import KuhnEquilibrium  # noqa: E402


def showdown(cards: tuple[int, int], history: str) -> int | None:
    """Player 0's payoff at a terminal Kuhn history (p pass, b bet), None if the game goes on."""
    higher = 1 if cards[0] > cards[1] else -1
    return {"pp": higher, "bp": 1, "pbp": -1, "bb": 2 * higher, "pbb": 2 * higher}.get(history)


def regularised_fixed_point(magnet: dict[str, float], alpha: float, iterations: int = 20000,
                            damping: float = 0.02) -> dict[str, float]:
    """The policy (probability of bet or call per information state) with pi ∝ magnet * exp(Q / alpha) at every
    information state, Q the action values against the policy itself: the fixed point of a reverse-KL
    regularised policy gradient towards ``magnet`` (magnetic mirror descent's), found by damped iteration."""
    policy = dict(magnet)

    def value(cards, history):  # player 0's expected payoff under ``policy``
        payoff = showdown(cards, history)
        if payoff is not None:
            return payoff
        bet = policy[str(cards[len(history) % 2]) + history]
        return (1 - bet) * value(cards, history + "p") + bet * value(cards, history + "b")

    def action_values(info):
        card, history = int(info[0]), info[1:]
        me, total, weight = len(history) % 2, np.zeros(2), 0.0
        for other in (c for c in range(3) if c != card):
            cards = (card, other) if me == 0 else (other, card)
            reach = 1.0  # the opponent's probability of its own moves on the way here
            for i, move in enumerate(history):
                if i % 2 != me:
                    bet = policy[str(cards[i % 2]) + history[:i]]
                    reach *= bet if move == "b" else 1 - bet
            sign = 1 if me == 0 else -1
            total += reach * sign * np.array([value(cards, history + "p"), value(cards, history + "b")])
            weight += reach
        return total / weight

    for _ in range(iterations):
        target = {}
        for info, m in magnet.items():
            q = action_values(info)
            target[info] = 1 / (1 + (1 - m) / m * np.exp((q[0] - q[1]) / alpha))
        policy = {info: (1 - damping) * policy[info] + damping * target[info] for info in policy}
    return policy


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bound", type=float, default=0.1, help="the NashConv bound")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--magnet", help="a league benchmark's league.json: its base model's moves as the magnet")
    parser.add_argument("--alphas", default="0.02,0.05,0.1,0.2", help="KL coefficients for --magnet")
    args = parser.parse_args(argv)
    from open_spiel.python.algorithms import exploitability
    from scipy.optimize import differential_evolution

    best_equilibrium = 0.0
    for alpha in (0.0, 1 / 6, 1 / 3):
        equilibrium, _ = tabular_policy(opponent_probabilities(KuhnEquilibrium(alpha=alpha)))
        wins, chips = exact_vs_random(equilibrium)
        best_equilibrium = max(best_equilibrium, wins)
        print(f"equilibrium alpha={alpha:.3f} vs random: win rate {wins:.4f}, chips a hand {chips:+.4f}")

    policy, _ = tabular_policy(lambda prompt, moves: [0.5, 0.5])
    infos = list(policy.state_lookup)
    rows = [policy.state_lookup[info] for info in infos]

    def set_bets(x):  # x[i]: the probability of bet (or call) at information state infos[i]
        policy.action_probability_array[rows] = np.stack([1 - x, x], axis=1)
        return policy

    def nash_conv(x):
        return exploitability.nash_conv(policy.game, set_bets(np.clip(x, 0, 1)))

    iterations, population = (5, 5) if args.quick else (300, 30)

    def penalised(x):
        return -exact_vs_random(set_bets(np.clip(x, 0, 1)))[0] + 100 * max(0.0, nash_conv(x) - args.bound)

    found = differential_evolution(penalised, [(0, 1)] * len(infos), seed=args.seed, maxiter=iterations,
                                   popsize=population, tol=1e-8)
    x = np.clip(found.x, 0, 1)
    excess = nash_conv(x)
    wins, chips = exact_vs_random(set_bets(x))
    print(f"most against random with NashConv <= {args.bound}: win rate {wins:.4f}, chips a hand {chips:+.4f} "
          f"(its NashConv {excess:.4f}); bet or call: " + " ".join(f"{i}:{p:.2f}" for i, p in zip(infos, x)))

    def seat_blind(y):  # y[2 * card + facing a bet]
        return nash_conv(np.array([y[2 * int(info[0]) + info.endswith("b")] for info in infos]))

    blind = differential_evolution(seat_blind, [(0, 1)] * 6, seed=args.seed, maxiter=iterations,
                                   popsize=population, tol=1e-10)
    print("least NashConv playing each card the same in both seats: "
          f"{blind.fun:.4f} (J, Q, K: open {blind.x[0]:.2f} {blind.x[2]:.2f} {blind.x[4]:.2f}, "
          f"facing a bet {blind.x[1]:.2f} {blind.x[3]:.2f} {blind.x[5]:.2f})")
    if args.magnet:
        table = json.loads(Path(args.magnet).read_text())["base_policy"]
        magnet = {info: moves.get("[bet]", moves.get("[call]")) for info, moves in table.items()}
        for alpha in (float(a) for a in args.alphas.split(",")):
            point = regularised_fixed_point(magnet, alpha, iterations=2000 if args.quick else 20000)
            fixed = np.array([point[i] for i in infos])
            print(f"KL-regularised fixed point, alpha={alpha:g}: NashConv {nash_conv(fixed):.4f}; bet or call: "
                  + " ".join(f"{i}:{p:.2f}" for i, p in zip(infos, fixed)))
    feasible = wins if excess <= args.bound + 1e-6 else float("nan")
    print(f"equilibrium_vs_random={best_equilibrium:.4f} max_vs_random_at_nash_conv_{args.bound:g}={feasible:.4f} "
          f"seat_blind_min_nash_conv={blind.fun:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
