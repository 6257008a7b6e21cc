"""A self-play league on Kuhn Poker: three learning members and their snapshots, measured.

    python benchmarks/league.py [--quick] [--out DIR] [hydra overrides...]

Runs `tidal league run` (configs/league.yaml: a main agent, a main exploiter and a league exploiter, each with
its own learner, replay and rollout actor, on an embedded Ray cluster over ZeroMQ) and reports:

- the league table: OpenSkill ratings of every member, snapshot and fixed opponent, and the payoff matrix;
- each main agent's win rate against the fixed opponents (`eval.opponents`, 2 x endpoint games a round);
- the exploitability (NashConv, OpenSpiel) of the main agent's Kuhn Poker policy before and after: its
  probability of each legal move at each of the 12 information states, read from the language model
  (the probability of the move's text and end of sequence after the state's prompt, normalised over the
  legal moves: what sampling at temperature 1 plays, given that it plays a legal move);
- the base model's and the main agent's win rate (share of hands won) and chips a hand against the random
  player, computed exactly from those move probabilities. (No policy within 0.1 of NashConv wins 0.6 of its
  hands against random: research/kuhn_bounds.py.)
- the NashConv of the average of the main agent's snapshots (each weighted by its own reach: the strategy that
  plays one snapshot, drawn uniformly, per hand; fictitious play's average converges where its last iterate
  need not). The main agent's own NashConv stays the measure of the last line.

Last line:

    members=<n> snapshots=<n> matches=<n> main_exploitability=<x> main_vs_random=<win rate>

`--quick` (about a minute after Ray starts): the same league on a tiny warm-up model for a few seconds of
training; it checks the harness end to end, its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import torch

from actors.models.base_model import ensure_base_model, load_policy, tiny_model_config
from actors.cli import load_config
from actors.runs.driver import Driver
from actors.league.table import format_table
from envs.kuhn_poker import CARDS, KuhnPoker

QUICK = ["run.minutes=0.25", "run.log_every_s=1", "eval.games_per_seat=10", "eval.endpoint_games_per_seat=10",
         "eval.every_s=0", "replay.args.batch_episodes=8", "replay.args.capacity_episodes=16",
         "env.args.concurrency=16", "league.args.snapshot_every_versions=3", "league.args.snapshot_min_versions=2",
         "model.tiny.warmup_games=200", "model.tiny.warmup_steps=30", "model.tiny.warmup_batch=32",
         "ray.num_cpus=2"]


def kuhn_state(info_state: str) -> KuhnPoker:
    """A game at an OpenSpiel Kuhn information state ("<card><p|b>*"), the player to move holding that card."""
    game, history = KuhnPoker(), info_state[1:]
    player = len(history) % 2
    card = int(info_state[0])
    game.cards = [card, (card + 1) % 3] if player == 0 else [(card + 1) % 3, card]
    for a in history:  # p: pass (check, or fold facing a bet); b: bet (bet, or call facing one)
        game.history.append(("fold" if game.facing_bet else "check") if a == "p" else ("call" if game.facing_bet else "bet"))
    assert CARDS[game.cards[player]] == CARDS[card]
    return game


def kuhn_prompt(info_state: str) -> tuple[str, list[str]]:
    """The env's prompt at an OpenSpiel Kuhn information state and its two moves in OpenSpiel's action order:
    0 pass (``[check]``, or ``[fold]`` facing a bet), 1 bet (``[bet]``, or ``[call]`` facing one). (The env
    lists a bet's answers as call, fold: its order would swap them.)"""
    game = kuhn_state(info_state)
    moves = ["[fold]", "[call]"] if game.facing_bet else ["[check]", "[bet]"]
    assert sorted(moves) == sorted(game.legal_actions())
    return game.observation(game.current_player), moves


def opponent_probabilities(opponent):
    """``probabilities(prompt, moves)`` of a fixed opponent with a ``policy(game)`` (envs/opponents.py)."""
    games = {}
    for info_state in (f"{card}{history}" for card in range(3) for history in ("", "p", "b", "pb")):
        game = kuhn_state(info_state)
        games[game.observation(game.current_player)] = game

    def probabilities(prompt: str, moves: list[str]) -> list[float]:
        policy = opponent.policy(games[prompt])
        return [policy.get(move.strip("[]"), 0.0) for move in moves]

    return probabilities


@torch.no_grad()
def move_probabilities(model, tokenizer, prompt: str, moves: list[str]) -> list[float]:
    """P(move text + EOS | prompt) for each move, normalised over ``moves``."""
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    scores = []
    for move in moves:
        answer = tokenizer(move, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        ids = torch.tensor([prompt_ids + answer])
        logprobs = torch.log_softmax(model(ids).logits[0, len(prompt_ids) - 1:-1].float(), dim=-1)
        scores.append(float(logprobs.gather(1, torch.tensor(answer)[:, None]).sum()))
    total = torch.logsumexp(torch.tensor(scores), 0)
    return [float(torch.exp(torch.tensor(s) - total)) for s in scores]


def model_probabilities(model_dir: str | Path):
    """``probabilities(prompt, moves)`` of the language-model policy in ``model_dir``."""
    model, tokenizer = load_policy(model_dir)
    return lambda prompt, moves: move_probabilities(model, tokenizer, prompt, moves)


def nash_conv(model_dir: str | Path) -> tuple[float, dict]:
    """NashConv of the policy in ``model_dir`` playing both seats of Kuhn Poker, and its move table."""
    return policy_nash_conv(model_probabilities(model_dir))


def policy_nash_conv(probabilities) -> tuple[float, dict]:
    """NashConv (OpenSpiel) of a policy given as ``probabilities(prompt, moves) -> [p(move) for move in moves]``,
    playing both seats, and its move table."""
    from open_spiel.python.algorithms import exploitability

    tabular, table = tabular_policy(probabilities)
    return float(exploitability.nash_conv(tabular.game, tabular)), table


def tabular_policy(probabilities):
    """An OpenSpiel tabular Kuhn Poker policy read from ``probabilities(prompt, moves)``, and its move table."""
    import pyspiel
    from open_spiel.python import policy as spiel_policy

    tabular = spiel_policy.TabularPolicy(pyspiel.load_game("kuhn_poker"))
    table = {}
    for info_state, row in tabular.state_lookup.items():
        prompt, moves = kuhn_prompt(info_state)
        probs = probabilities(prompt, moves)
        tabular.action_probability_array[row] = probs  # moves come in OpenSpiel's action order
        table[info_state] = dict(zip(moves, (round(p, 3) for p in probs)))
    return tabular, table


def average_nash_conv(policies: list) -> float:
    """NashConv of the average of OpenSpiel Kuhn ``policies`` (each weighted by its own reach at every state:
    the mixed strategy that draws one of them per hand, which fictitious play converges with), both seats."""
    from open_spiel.python.algorithms import exploitability, policy_aggregator

    game = policies[0].game
    weights = [1.0 / len(policies)] * len(policies)
    average = policy_aggregator.PolicyAggregator(game).aggregate([0, 1], [policies, policies], [weights, weights])
    return float(exploitability.nash_conv(game, average))


def exact_vs_random(policy) -> tuple[float, float]:
    """Exactly, over every deal and move: the OpenSpiel Kuhn ``policy``'s win rate (share of hands won) and mean
    chips won per hand against the uniformly random player, each seat half the time."""
    from open_spiel.python import policy as spiel_policy

    game = policy.game
    opponent = spiel_policy.UniformRandomPolicy(game)

    def walk(state, p, me):  # -> (probability of a won hand, expected chips), summed below ``state``
        if state.is_terminal():
            return p * (state.returns()[me] > 0), p * state.returns()[me]
        if state.is_chance_node():
            children = state.chance_outcomes()
        else:
            children = (policy if state.current_player() == me else opponent).action_probabilities(state).items()
        wins = chips = 0.0
        for action, q in children:
            w, c = walk(state.child(action), p * q, me)
            wins, chips = wins + w, chips + c
        return wins, chips

    seats = [walk(game.new_initial_state(), 1.0, me) for me in (0, 1)]
    return sum(w for w, _ in seats) / 2, sum(c for _, c in seats) / 2


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default="runs/league-benchmark")
    args, overrides = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    out = Path(args.out)
    cfg = load_config([*(QUICK if args.quick else []), f"run.dir={out}", f"run.name=league-{int(time.time())}",
                       *overrides], "league")
    base = Path(cfg.model.path) if cfg.model.path else \
        ensure_base_model(cfg.model.cache_dir, tiny_model_config(cfg))
    cfg.model.path = str(base)
    base_nash, base_table = nash_conv(base)
    started = time.time()
    summary = Driver(cfg).execute()
    minutes = (time.time() - started) / 60
    run_dir = Path(summary["run_dir"])
    state = json.loads((run_dir / "league" / "league_state.json").read_text())
    print(format_table(state))
    mains = [m.id for m in cfg.league.members if m.role == "main"]
    finals = {(e["player"], e["opponent"]): e["win_rate"] for e in summary["evaluations"] if e["tag"].startswith("final")}
    starts = {(e["player"], e["opponent"]): e["win_rate"] for e in summary["evaluations"] if e["tag"].startswith("start")}
    for (player, opponent), rate in sorted(finals.items()):
        print(f"{player} vs {opponent}: win rate {starts.get((player, opponent), float('nan')):.3f} (base) -> {rate:.3f}")
    main_nash, main_table = nash_conv(run_dir / "members" / mains[0] / "policy")
    played = [s for s in state["snapshots"]
              if any(g > 0 for a, b, _, _, g in state["payoff"]["counts"] if b == s)]
    print(f"NashConv (OpenSpiel): base model {base_nash:.4f}, {mains[0]} {main_nash:.4f}")
    own = [s for s in state["snapshots"] if s.startswith(f"{mains[0]}-v")]
    average_nash = None  # no snapshot of the main agent yet (a --quick run may end before one)
    if own:
        snapshots = run_dir / "league" / "snapshots"
        average_nash = average_nash_conv([tabular_policy(model_probabilities(snapshots / s))[0] for s in own])
        print(f"NashConv of the average of {mains[0]}'s {len(own)} snapshots (one drawn per hand): {average_nash:.4f}")
    exact = {name: exact_vs_random(tabular_policy(model_probabilities(path))[0])
             for name, path in (("base", base), (mains[0], run_dir / "members" / mains[0] / "policy"))}
    for name, (wins, chips) in exact.items():
        print(f"{name} vs random, exactly from its move probabilities: win rate {wins:.3f}, chips a hand {chips:+.3f}")
    print(f"snapshots taken {len(state['snapshots'])}, played against {len(played)}; league minutes {minutes:.1f}")
    (out / "league.json").write_text(json.dumps({
        "run_dir": str(run_dir), "base_nash_conv": base_nash, "main_nash_conv": main_nash, "base_policy": base_table,
        "main_policy": main_table, "main_snapshots_average_nash_conv": average_nash,
        "evaluations": summary["evaluations"], "snapshots_played": played,
        "exact_vs_random": {name: {"win_rate": w, "chips": c} for name, (w, c) in exact.items()},
        "minutes": minutes}, indent=1))
    print(f"members={len(cfg.league.members)} snapshots={len(state['snapshots'])} "
          f"matches={state['stats']['matches']} main_exploitability={main_nash:.4f} "
          f"main_vs_random={finals.get((mains[0], 'random'), float('nan')):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
