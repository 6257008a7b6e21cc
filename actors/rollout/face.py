"""What the driver may call on a rollout actor (``RolloutFace``: its statistics only), and their shape.

The driver reaches an actor only through a handle on its face (`actors.runs.handles`): a method not declared here
is refused before it reaches the actor. ``tests/runs/test_handles.py`` checks that ``RolloutActor`` has each of
these methods with the same signature, and that its statistics hold exactly these keys.
"""

from __future__ import annotations

from typing import Protocol, TypedDict


class _RolloutStatistics(TypedDict):
    requests: int
    tokens: int
    batches: int
    generate_s: float
    weights_applied: int
    weights_applied_mid_batch: int
    version_waits: int
    idle_s: float
    refused_requests: int
    lives_followed: int
    version_timeouts: int  # requests refused after waiting ``version_wait_s`` for their min_version's weights
    rejected_requests: int
    rejected_by_reason: dict[str, int]
    version: int  # of the weights it serves
    life: int
    learner_life: int
    announced: int | None  # the highest version its learner announced (None: nothing heard yet)
    backend: str
    dropped_frames: int
    idle_fraction: float
    queued_requests: int
    weights: dict  # what following the learner's weights took (``WeightsFollower``)
    vllm: dict  # the vLLM engine's own (``backend=vllm``)
    streams: dict[str, dict]


class RolloutStatistics(_RolloutStatistics, total=False):
    """A rollout actor's statistics; the two below appear with the first snapshot they count."""

    snapshots_loaded: int  # snapshots of its policy it loaded to serve (a league's)
    unknown_policy: int  # a policy it does not serve, or a snapshot that failed its checks


class RolloutFace(Protocol):
    """What the driver may call on a rollout actor."""

    def statistics(self) -> RolloutStatistics: ...
