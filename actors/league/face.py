"""What the driver may call on the league actor (``LeagueFace``), and the shape of its ``statistics()``.

The driver reaches an actor only through a handle on its face (`actors.runs.handles`): a method not declared here
is refused before it reaches the actor. ``tests/runs/test_handles.py`` checks that ``LeagueActor`` has each of
these methods with the same signature, and that its statistics hold exactly these keys.
"""

from __future__ import annotations

from typing import Protocol, TypedDict


class LeagueStatistics(TypedDict):
    matches: int  # rated matches, over the league's lives (its saved state and journal)
    requests: int
    results: int
    errored_matches: int
    unrated_matches: int
    refused_snapshots: int
    saves: int
    snapshots: int  # the population's snapshots
    pending_snapshots: list[str]  # asked for and not registered yet
    rejected_results: int
    rejected_by_reason: dict[str, int]
    resets: int
    ratings: dict[str, float]  # each player's rating (its ordinal)
    dropped_frames: int
    streams: dict[str, dict]
    replies: dict


class LeagueFace(Protocol):
    """What the driver may call on the league actor (``LeagueActor`` says what each does)."""

    def observe(self, versions: dict[str, int]) -> dict[str, bool]: ...

    def expect_snapshots(self, asked: dict[str, bool]) -> None: ...

    def add_snapshot(self, snapshot: str, member: str, version: int, path: str) -> bool: ...

    def record_evaluation(self, evaluation: dict) -> None: ...

    def table(self) -> dict: ...

    def statistics(self) -> LeagueStatistics: ...
