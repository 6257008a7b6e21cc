"""What the league benchmark's two Kuhn Poker targets allow together: exact, no model involved.

    python research/kuhn_bounds.py [--bound 0.1] [--seed 0] [--quick]

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
  pi(a) proportional to magnet(a) * exp(Q(a) / alpha), Q its action values (OpenSpiel), iterated with damping; its
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.league import exact_vs_random, opponent_probabilities, tabular_policy  # noqa: E402

from envs.opponents import KuhnEquilibrium  # noqa: E402


def regularised_fixed_point(policy, magnet: np.ndarray, alpha: float, iterations: int = 20000,
                            damping: float = 0.02) -> np.ndarray:
    """The probability of bet or call at each row of the tabular ``policy`` with pi ∝ magnet * exp(Q / alpha) at
    every information state, Q the action values against the policy itself (OpenSpiel's tree walk): the fixed
    point of a reverse-KL regularised policy gradient towards ``magnet`` (magnetic mirror descent's), found by
    damped iteration. ``policy`` is left holding it."""
    from open_spiel.python.algorithms.action_value import TreeWalkCalculator

    calculator, bets = TreeWalkCalculator(policy.game), magnet.copy()
    for _ in range(iterations):
        policy.action_probability_array[:] = np.stack([1 - bets, bets], axis=1)
        q = np.array(calculator([policy, policy], policy).action_values)
        target = 1 / (1 + (1 - magnet) / magnet * np.exp((q[:, 0] - q[:, 1]) / alpha))
        bets = (1 - damping) * bets + damping * target
    return bets


def equilibria_vs_random() -> float:
    """Print the equilibrium family's play against random; return its best share of hands won."""
    best = 0.0
    for alpha in (0.0, 1 / 6, 1 / 3):
        equilibrium, _ = tabular_policy(opponent_probabilities(KuhnEquilibrium(alpha=alpha)))
        wins, chips = exact_vs_random(equilibrium)
        best = max(best, wins)
        print(f"equilibrium alpha={alpha:.3f} vs random: win rate {wins:.4f}, chips a hand {chips:+.4f}")
    return best


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

    best_equilibrium = equilibria_vs_random()
    policy, _ = tabular_policy(lambda prompt, moves: [0.5, 0.5])
    infos = list(policy.state_lookup)  # in the order of the policy's rows

    def set_bets(x):  # x[i]: the probability of bet (or call) at information state infos[i]
        policy.action_probability_array[:] = np.stack([1 - x, x], axis=1)
        return policy

    def nash_conv(x):
        return exploitability.nash_conv(policy.game, set_bets(np.clip(x, 0, 1)))

    def penalised(x):
        return -exact_vs_random(set_bets(np.clip(x, 0, 1)))[0] + 100 * max(0.0, nash_conv(x) - args.bound)

    def seat_blind(y):  # y[2 * card + facing a bet]
        return nash_conv(np.array([y[2 * int(info[0]) + info.endswith("b")] for info in infos]))

    search = dict(seed=args.seed, maxiter=5 if args.quick else 300, popsize=5 if args.quick else 30)
    x = np.clip(differential_evolution(penalised, [(0, 1)] * len(infos), tol=1e-8, **search).x, 0, 1)
    excess = nash_conv(x)
    wins, chips = exact_vs_random(set_bets(x))
    print(f"most against random with NashConv <= {args.bound}: win rate {wins:.4f}, chips a hand {chips:+.4f} "
          f"(its NashConv {excess:.4f}); bet or call: " + " ".join(f"{i}:{p:.2f}" for i, p in zip(infos, x)))
    blind = differential_evolution(seat_blind, [(0, 1)] * 6, tol=1e-10, **search)
    print("least NashConv playing each card the same in both seats: "
          f"{blind.fun:.4f} (J, Q, K: open {blind.x[0]:.2f} {blind.x[2]:.2f} {blind.x[4]:.2f}, "
          f"facing a bet {blind.x[1]:.2f} {blind.x[3]:.2f} {blind.x[5]:.2f})")
    if args.magnet:
        table = json.loads(Path(args.magnet).read_text())["base_policy"]
        magnet = np.array([table[info].get("[bet]", table[info].get("[call]")) for info in infos])
        for alpha in (float(a) for a in args.alphas.split(",")):
            fixed = regularised_fixed_point(policy, magnet, alpha, iterations=2000 if args.quick else 20000)
            print(f"KL-regularised fixed point, alpha={alpha:g}: NashConv {nash_conv(fixed):.4f}; bet or call: "
                  + " ".join(f"{i}:{p:.2f}" for i, p in zip(infos, fixed)))
    feasible = wins if excess <= args.bound + 1e-6 else float("nan")
    print(f"equilibrium_vs_random={best_equilibrium:.4f} max_vs_random_at_nash_conv_{args.bound:g}={feasible:.4f} "
          f"seat_blind_min_nash_conv={blind.fun:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
