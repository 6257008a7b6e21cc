"""What the driver may call on a reward actor (``RewardFace``: its statistics only), and their shape.

The driver reaches an actor only through a handle on its face (`actors.runs.handles`): a method not declared here
is refused before it reaches the actor. ``tests/runs/test_handles.py`` checks that ``RewardActor`` has each of
these methods with the same signature, and that its statistics hold exactly these keys.
"""

from __future__ import annotations

from typing import Protocol, TypedDict


class RewardStatistics(TypedDict):
    episodes: int
    rows: int
    rejected_episodes: int
    unscored: int
    rejected_rows: int
    rejected_by_reason: dict[str, int]
    unscored_by_reason: dict[str, int]
    scorer: dict  # the scorer's own (a judge's batches and timings; a function's: none)
    drop_notices: int  # episodes dropped here (unscored, rejected) and told to their env actors
    dropped_frames: int
    streams: dict[str, dict]


class RewardFace(Protocol):
    """What the driver may call on a reward actor."""

    def statistics(self) -> RewardStatistics: ...
