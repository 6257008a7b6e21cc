"""What the league benchmark's two Kuhn Poker targets allow together: exact, no model involved.

    python benchmarks/kuhn_bounds.py [--bound 0.1] [--seed 0] [--quick]

The league benchmark asks for a main agent with NashConv <= 0.1 that wins >= 0.6 of its hands against the
uniformly random player. This prints, exactly (OpenSpiel over every deal and move):

- the equilibrium family's (alpha in 0, 1/6, 1/3; envs/opponents.py) win rate and chips a hand against random:
  the equilibrium wins at most half its hands against random (it wins chips: folding J, calling with K);
- the most any policy with NashConv <= bound wins against random: a differential-evolution search (SciPy) over
  the 12 probabilities of betting or calling, with the NashConv excess as a penalty; the policy it found;
- the least NashConv of a policy that plays a card the same way in both seats (one probability for opening,
  one for facing a bet, per card): what a model that ignores its seat and the history can reach.

Last line:

    equilibrium_vs_random=<best of the family> max_vs_random_at_nash_conv_<bound>=<win rate>
    seat_blind_min_nash_conv=<x>

(one line; wrapped here)

`--quick`: a short search (a few seconds; the search's numbers are then lower bounds only).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from league import exact_vs_random, opponent_probabilities, tabular_policy  # noqa: E402 (benchmarks/league.py)

from envs.opponents import KuhnEquilibrium  # noqa: E402


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bound", type=float, default=0.1, help="the NashConv bound")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true")
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
    feasible = wins if excess <= args.bound + 1e-6 else float("nan")
    print(f"equilibrium_vs_random={best_equilibrium:.4f} max_vs_random_at_nash_conv_{args.bound:g}={feasible:.4f} "
          f"seat_blind_min_nash_conv={blind.fun:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
