"""Environments and opponents by name: ``envs.make("tictactoe")``."""

from __future__ import annotations

from typing import Callable

from envs.base import Game
from envs.opponents import RandomOpponent
from envs.tictactoe import TicTacToe

GAMES: dict[str, Callable[..., Game]] = {"tictactoe": TicTacToe}
OPPONENTS: dict[str, Callable[..., object]] = {"random": RandomOpponent}


def make(name: str, **kwargs) -> Game:
    try:
        factory = GAMES[name]
    except KeyError:
        raise ValueError(f"unknown environment {name!r}; known: {', '.join(sorted(GAMES))}") from None
    return factory(**kwargs)


def make_opponent(name: str, **kwargs):
    try:
        factory = OPPONENTS[name]
    except KeyError:
        raise ValueError(f"unknown opponent {name!r}; known: {', '.join(sorted(OPPONENTS))}") from None
    return factory(**kwargs)
