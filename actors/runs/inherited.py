"""A resumed run's replay took over the previous life's live episodes and batches (`actors.replay.actor`): the env actors
count them as started, so that new episodes wait for the learner to consume them and the staleness bound holds;
and replay holds them back until the run starts training (``release_inherited``), so that its resume evaluation
is played by the checkpointed policy.

They are spread over the env actors' admission shares as a scale of env actors spreads a total (``rebalance``,
`actors.env.admission`): called before training starts, when each actor's count is its offset. Only the env actors'
own policy (a league's first member) has its count moved: another member's replay may hold episodes taken over
beyond its allowance, and its learner's staleness bound drops their tokens that fall too far behind (counted).
"""

from __future__ import annotations

import logging

from actors.env.admission import admission_share
from actors.env.face import EnvFace, EnvStatistics
from actors.learner.face import LearnerFace
from actors.replay.face import ReplayFace
from actors.runs.handles import call_unless_dead, handle

log = logging.getLogger(__name__)


def count_inherited(cluster, top) -> int:
    """Move the env actors' admission counts by the episodes their policy's replay took over; returns how many."""
    replay = handle(cluster, next(iter(top.groups.values())).replay, ReplayFace)
    inherited = replay.statistics().get("inherited_episodes", 0)
    if not inherited or not top.envs:
        return 0
    envs = {name: handle(cluster, name, EnvFace) for name in top.envs}
    stats: dict[str, EnvStatistics] = {name: env.statistics() for name, env in envs.items()}
    total = sum(s["admission_offset"] for s in stats.values())  # what the learner consumed before this life
    for name, s in stats.items():
        i, n = s["admission_slot"]
        delta = admission_share(total + inherited, i, n) - s["admission_offset"]
        cluster.reconfigure(name, admission_offset=s["admission_offset"] + delta)  # what a restart of it counts
        envs[name].rebalance((i, n), delta)
    log.info("the %d episodes replay took over from the previous life count as started", inherited)
    return inherited


def release_inherited(cluster, top) -> None:
    """Training starts: each replay sends what it took over, after its learner's data cursor (0 in a new life)."""
    for group in top.groups.values():  # a replay found dead is restarted, and rewound, by the health check
        replay = handle(cluster, group.replay, ReplayFace)
        if (call_unless_dead(replay.statistics) or {}).get("held_back"):
            call_unless_dead(replay.rewind, handle(cluster, group.learner, LearnerFace).statistics()["cursor"])
