"""What the driver may call on a learner (``LearnerFace``), and the shape of its ``statistics()``.

The driver reaches an actor only through a handle on its face (`actors.runs.handles`): a method not declared here
is refused before it reaches the actor. ``tests/runs/test_handles.py`` checks that ``LearnerActor`` has each of
these methods with the same signature, and that its statistics hold exactly these keys.
"""

from __future__ import annotations

from typing import Protocol, TypedDict


class SnapshotWritten(TypedDict):
    """A snapshot of the policy the learner wrote (a league's), registered with the league by the driver."""
    id: str
    version: int
    path: str


class LearnerStatistics(TypedDict):
    batches: int
    episodes: int
    tokens: int
    train_s: float
    rejected_episodes: int  # by the staleness bound: left with no turn
    rejected_turns: int
    rejected_tokens: int
    duplicate_batches: int  # at or below the cursor, dropped
    early_batches: int  # beyond the next number, dropped
    version: int
    life: int
    cursor: int  # the number of the last batch consumed
    last: dict  # the last update's statistics (losses, staleness, importance weights, lr, ...)
    dropped_frames: int
    busy: float  # the share of the wall time spent training, since the first batch
    snapshots: list[SnapshotWritten]
    resets: list[int]  # the versions that started again from the base model
    staleness_hist: dict[str, int]  # tokens trained on, by staleness, over the run
    weights: dict  # what publishing the weights took
    dataset: dict  # the episode dataset written (``learner.dataset``)
    streams: dict[str, dict]


class LearnerFace(Protocol):
    """What the driver may call on a learner (``LearnerActor`` says what each does)."""

    def snapshot(self, root: str, reset: bool = False) -> None: ...

    def statistics(self) -> LearnerStatistics: ...
