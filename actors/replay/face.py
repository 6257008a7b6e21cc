"""What the driver may call on a replay actor (``ReplayFace``), and the shape of its ``statistics()``.

The driver reaches an actor only through a handle on its face (`actors.runs.handles`): a method not declared here
is refused before it reaches the actor. ``tests/runs/test_handles.py`` checks that ``ReplayActor`` has each of
these methods with the same signature, and that its statistics hold exactly these keys.
"""

from __future__ import annotations

from typing import Protocol, TypedDict


class _ReplayStatistics(TypedDict):
    episodes_in: int
    batches_out: int
    episodes_out: int
    duplicate_episodes: int  # a second copy of an episode held or batched, dropped
    batches_resent: int  # by ``rewind``
    reloaded_episodes: int  # from the spill, by a restarted replay
    short_batches: int  # fewer than ``batch_episodes``: cut by bytes
    compactions: int
    compacted_episodes: int
    inherited_batches: int  # taken over from the previous life of a resumed run
    inherited_episodes: int
    buffered: int  # episodes held
    batches_logged: int  # the number of the last batch
    received_by_source: dict[str, int]  # env actor -> its episodes held or batched
    compacted_through: int
    rejected_rows: int
    rejected_by_reason: dict[str, int]
    learner_version: int | None  # the highest its learner announced (None: none yet)
    learner_life: int  # the newest life of its learner announced
    drop_notices: int  # episodes rejected whole or refused, told to their env actors
    refused_episodes: int  # larger than a batch may be
    refused_by_reason: dict[str, int]
    batch_bytes_limit: int
    held_back: bool  # what a resumed run took over waits for the first ``rewind``
    dropped_frames: int
    streams: dict[str, dict]


class ReplayStatistics(_ReplayStatistics, total=False):
    """A replay actor's statistics; the two below appear with the first episode they count."""

    empty_episodes: int  # episodes that came without a row
    rejected_episodes: int  # episodes none of whose rows passed the checks


class ReplayFace(Protocol):
    """What the driver may call on a replay actor (``ReplayActor`` says what each does)."""

    def rewind(self, consumed: int) -> None: ...

    def statistics(self) -> ReplayStatistics: ...
