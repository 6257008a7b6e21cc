"""Autoscaling rollout actors on the depth of the generation queue: a pure decision, taken by the run's loop.

Ray's autoscaler supplies machines on a cluster; tidal only decides how many rollout actors to ask Ray for.
Add one while the requests waiting at the rollout actors stayed above ``queue_high`` per actor for ``patience``
snapshots in a row; remove one while the rollout actors stayed idle more than ``idle_above`` of the time (their
mean idle fraction) for as long; always within [``min_actors``, ``max_actors``]. One step at a time, and after a
step the history starts again, so each decision sees the effect of the last. Its settings are
``rollout.autoscale`` (``config.AutoscaleConfig``).
"""

from __future__ import annotations

from actors.runs.config import AutoscaleConfig


def autoscale_target(cfg: AutoscaleConfig, actors: int, history: list[tuple[int, float]]) -> int:
    """How many rollout actors to run, given ``actors`` now and the snapshots since the last step, oldest first:
    (requests waiting at the rollout actors, their mean idle fraction)."""
    recent = history[-cfg.patience:]
    if len(recent) < cfg.patience:
        return max(cfg.min_actors, min(actors, cfg.max_actors))
    if all(queued > cfg.queue_high * actors for queued, _ in recent) and actors < cfg.max_actors:
        return actors + 1
    if all(idle > cfg.idle_above for _, idle in recent) and actors > cfg.min_actors:
        return actors - 1
    return max(cfg.min_actors, min(actors, cfg.max_actors))
