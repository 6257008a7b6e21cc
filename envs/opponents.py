"""Fixed opponents: seats played by a rule instead of a policy."""

from __future__ import annotations

import random

from envs.base import Game


class RandomOpponent:
    """Plays a uniformly random legal action."""

    name = "random"

    def __init__(self, seed: int | None = None):
        self.rng = random.Random(seed)

    def act(self, game: Game) -> str:
        return self.rng.choice(game.legal_actions())
