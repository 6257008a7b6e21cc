"""Text environments and games for tidal."""

from envs.base import Game, StepResult
from envs.registry import make, make_opponent

__all__ = ["Game", "StepResult", "make", "make_opponent"]
