"""What the driver may call on an env actor (``EnvFace``), and the shape of its ``statistics()``.

The driver reaches an actor only through a handle on its face (`actors.runs.handles`): a method not declared here
is refused before it reaches the actor. ``tests/runs/test_handles.py`` checks that ``EnvActor`` has each of these
methods with the same signature, and that its statistics hold exactly these keys.
"""

from __future__ import annotations

from typing import Protocol, TypedDict


class SeatCounts(TypedDict):
    """One seat's games of an evaluation: ``invalid`` counts the games with an invalid action of the player's."""
    games: int
    wins: int
    draws: int
    losses: int
    invalid: int


class EvaluationShare(TypedDict):
    """This actor's share of one evaluation (``EvaluationTally.summary``), merged by the driver once ``done``."""
    tag: str
    opponent: str
    done: bool
    seats: dict[int, SeatCounts]
    nonloss: float | None  # the mean over seats of 1 - losses / games (None: no game yet)
    version_min: int | None  # the oldest and newest policy version that played a token (None: none did)
    version_max: int | None


class _EnvStatistics(TypedDict):
    # every episode this actor played, training and evaluation (``EpisodeCounts``); besides these, one
    # ``mean_return_seat<i>`` per seat of the game, which a TypedDict cannot name
    episodes: int
    steps: int
    turns: int
    invalid_actions: int  # every invalid move, unreadable completions included
    unreadable_actions: int  # the policy's completions with no answer in the answer form (``envs.answers``)
    forfeits: int
    errored: int
    truncated_actions: int
    truncated_prompts: int
    refused_generations: int
    lost_completions: int  # episodes ended (errored) with a move unanswered after its deadline and one reissue
    context_full_episodes: int  # ended truncated: a turn's prompt and budget would not fit max_context_tokens
    turns_by_role: dict[str, int]  # the policy's turns by role (a role game's), and its invalid moves
    invalid_by_role: dict[str, int]
    # training episodes: the policy's summed return over its seats, and the episodes that gave no row
    train_episodes: int
    train_return_sum: float
    train_episodes_without_rows: int
    # admission (``Admission``): what bounds staleness
    admission_waits: int
    started: int  # training episodes counted as started (a restart's predecessors' deliveries included)
    admission_offset: int  # beyond those delivered, what a restart of this actor counts as started
    admission_slot: list[int]  # [i, n]: this actor's share of the allowance among n env actors
    learner_version: int
    admission_limit: int
    versions: dict[str, int]  # each learning member's announced version
    etas: dict[str, int]
    learner_lives: dict[str, int]
    given_back_by_reason: dict[str, int]  # training episodes never to be consumed, their admission given back
    training_in_flight: int
    drained: bool  # retired, and every episode it started delivered or given back
    # the policy client, the match source and the streams (zeros before ``run``)
    reissued_requests: int
    duplicate_completions: int
    request_frames: int
    completion_frames: int
    live_episodes: int
    dropped_frames: int
    stray_matches: int
    reissued_match_requests: int
    opponent_seat_probabilities: dict[str, float]
    prompt_cache_hits: int
    streams: dict[str, dict]
    evaluations: list[EvaluationShare]


class EnvStatistics(_EnvStatistics, total=False):
    """An env actor's statistics; a role game's actor has a task buffer's besides."""

    task_buffer: dict  # a role game's task buffer (``envs.task_buffer``): its size and solve rates


class EnvFace(Protocol):
    """What the driver may call on an env actor (``EnvActor`` says what each does)."""

    def set_training(self, on: bool) -> None: ...

    def evaluate(self, tag: str, games_per_seat: int, opponent: str = "random", player: str = "policy") -> None: ...

    def set_rollouts(self, addresses: list[str], member: str | None = None) -> None: ...

    def rebalance(self, slot: tuple[int, int], delta: int) -> int: ...

    def retire(self) -> None: ...

    def reissue(self) -> int: ...

    def reissue_match_request(self) -> bool: ...

    def statistics(self) -> EnvStatistics: ...
