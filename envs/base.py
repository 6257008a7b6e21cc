"""The game interface every tidal environment speaks.

A game is turn based and has ``num_players`` seats. The env actor asks whose turn it is, shows that seat
its own observation (a prompt), and passes back the text the seat answered. Rewards are per seat and come
when the game ends; an invalid action ends the game and is reported, never raised.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class StepResult:
    """What one move did. ``rewards`` has one entry per seat and is non-zero only at the end."""

    rewards: list[float]
    terminated: bool
    truncated: bool = False
    invalid: bool = False
    info: dict = field(default_factory=dict)


class Game(Protocol):
    """A turn-based text game with ``num_players`` seats (roles are given by the prompt)."""

    name: str
    num_players: int

    def reset(self, seed: int) -> None: ...

    @property
    def current_player(self) -> int: ...

    def observation(self, player: int) -> str: ...

    def step(self, action_text: str) -> StepResult: ...

    def legal_actions(self) -> list[str]: ...
