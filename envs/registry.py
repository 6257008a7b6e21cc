"""Environments and opponents by name: ``envs.make("tictactoe")``, ``envs.make("gem:game:GuessTheNumber-v0")``.

``make`` returns a ``Game`` for every environment, single-agent ones seated as one-player games, wrapped in
the invalid-action rules of ``envs.invalid``. ``tidal envs`` prints ``listing()``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from envs.base import Game
from envs.invalid import InvalidActions
from envs.countdown import Countdown
from envs.guess_number import GuessNumber
from envs.kuhn_poker import KuhnPoker
from envs.liars_dice import LiarsDice
from envs.negotiation import SimpleNegotiation
from envs.opponents import GreedyOpponent, KuhnEquilibrium, MinimaxOpponent, RandomOpponent, SecretKeeperScript
from envs.propose_solve import build as build_propose_solve
from envs.secret_keeper import SecretKeeper
from envs.single_agent import SingleAgentGame
from envs.tictactoe import TicTacToe
from envs.tool_latency import ToolLatencyTask

GEM_PREFIX = "gem:"


@dataclass(frozen=True)
class Registered:
    factory: Callable[..., object]
    players: str  # "1" for a single-agent Env (GEM's interface), else the seats of the Game, e.g. "2-6"
    summary: str

    @property
    def single_agent(self) -> bool:
        return self.players == "1"


ENVIRONMENTS: dict[str, Registered] = {
    "tictactoe": Registered(TicTacToe, "2", "TicTacToe; a free cell: [5]"),
    "kuhn_poker": Registered(KuhnPoker, "2", "Kuhn Poker, three cards, ante 1: [check] [bet] [call] [fold]"),
    "negotiation": Registered(SimpleNegotiation, "2",
                              "trade wood/stone/gold at private values: [offer 2 wood for 1 gold] [accept] [deny]"),
    "liars_dice": Registered(LiarsDice, "2-6", "Liar's Dice (players=2..6, dice=2): [bid 3 5] [liar]"),
    "secret_keeper": Registered(SecretKeeper, "2",
                                "attacker makes a defender leak its secret, rule-judged: [any ASCII message]"),
    "propose_solve": Registered(build_propose_solve, "2-9",
                                "one policy proposes Countdown tasks and k solvers (solvers=1..8) answer: "
                                "[3 4 5 -> 17], [(3 * 4) + 5]"),
    "guess_number": Registered(GuessNumber, "1", "find a hidden number with higher/lower feedback: [37]"),
    "countdown": Registered(Countdown, "1", "reach a target with + - * /, verified exactly: [(25 - 5) * 4]"),
    "tool_latency": Registered(ToolLatencyTask, "1",
                               "sum hidden values via a slow lookup tool (heavy-tailed async latency): [lookup apple]"),
}
OPPONENTS: dict[str, Callable[..., object]] = {
    "random": RandomOpponent, "minimax": MinimaxOpponent, "greedy": GreedyOpponent,
    "kuhn_equilibrium": KuhnEquilibrium, "secret_keeper_script": SecretKeeperScript}


def make(name: str, *, invalid_penalty: float = -1.0, max_retries: int = 0, retry_penalty: float = -0.1,
         **kwargs) -> Game:
    """The environment ``name`` built with ``kwargs``, as a Game with the invalid-action rules applied."""
    if name.startswith(GEM_PREFIX):
        from envs.gem_adapter import make_gem

        game = SingleAgentGame(make_gem(name[len(GEM_PREFIX):], **kwargs), name)
    else:
        spec = ENVIRONMENTS.get(name)
        if spec is None:
            known = ", ".join(sorted(ENVIRONMENTS))
            raise ValueError(f"unknown environment {name!r}; known: {known}, or gem:<GEM id>")
        try:
            made = spec.factory(**kwargs)
        except TypeError as error:
            raise ValueError(f"environment {name!r} does not take these arguments: {error}") from None
        game = SingleAgentGame(made, name) if spec.single_agent else made
    return InvalidActions(game, invalid_penalty=invalid_penalty, max_retries=max_retries,
                          retry_penalty=retry_penalty)


def make_opponent(name: str, **kwargs):
    try:
        factory = OPPONENTS[name]
    except KeyError:
        raise ValueError(f"unknown opponent {name!r}; known: {', '.join(sorted(OPPONENTS))}") from None
    return factory(**kwargs)


def listing() -> str:
    """One line per environment and opponent: name, players, what it is."""
    lines = [f"{'environment':<18} {'players':<8} description"]
    lines += [f"{name:<18} {spec.players:<8} {spec.summary}" for name, spec in sorted(ENVIRONMENTS.items())]
    lines.append(f"{'gem:<id>':<18} {'1':<8} any GEM environment (pip install gem-llm), e.g. gem:game:GuessTheNumber-v0")
    lines += ["", "opponents: " + ", ".join(sorted(OPPONENTS))]
    return "\n".join(lines)
