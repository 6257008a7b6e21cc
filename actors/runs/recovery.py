"""Restarting a dead actor of one policy's group: its rollout actors, reward, replay and learner.

A single-policy run has one such group; a league has one per learning member (the env actors and the league
are shared: ``restart_env`` serves both kinds of run, and a league run restarts its league). Each actor comes back
at its old addresses (``cluster.restart``), and nothing is lost or counted twice (docs/faults-and-scaling.md):

- a rollout actor: the env actors send again every request still unanswered (which only it knew);
- a reward actor: the env actors send again what it had not acknowledged;
- a replay actor: it reloads its spill, and sends again the batches after the learner's data cursor;
- a learner: from its last checkpoint (or the base model), as a new life (its followers take its versions even
  when lower than its predecessor's), and replay sends again the batches after its cursor.

An actor dies of a kill or of a crash (its loop raised, and its process ended: ``actors/runs/host.py``); either way it
is restarted, within a limit (``RestartLimit``).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from actors.env.face import EnvFace
from actors.learner.face import LearnerFace
from actors.replay.face import ReplayFace
from actors.runs.handles import call_unless_dead, handle

log = logging.getLogger(__name__)
MAX_BACKOFF_S = 60.0  # the longest wait before a restart
NO_ANSWER = "no answer"  # what `statistics_within` gives for an actor that did not answer in time


class HungActor(RuntimeError):
    """An actor alive to Ray that answered none of its last ``run.ping_misses`` health checks: restarted as if
    dead."""


class Liveness:
    """The health check's deadline and what it remembers of each actor (``run.mode=ray``): an actor that answers
    neither its ping nor its statistics within ``timeout_s`` is silent for that check (its last statistics stand
    in); silent ``misses`` checks in a row, it is hung. Without a deadline, one stopped or deadlocked actor froze
    the driver: no metrics, no restarts, no ``tidal stop``, no budget."""

    def __init__(self, timeout_s: float = 30.0, misses: int = 3):
        self.timeout_s, self.misses = timeout_s, misses
        self.missed: dict[str, int] = {}  # actor -> checks in a row it did not answer
        self.last: dict[str, Any] = {}  # actor -> the statistics it last answered

    def answered(self, name: str, stats) -> None:
        self.missed.pop(name, None)
        self.last[name] = stats

    def silent(self) -> list[str]:
        """The actors that did not answer the last check."""
        return sorted(self.missed)


class RestartsExhausted(RuntimeError):
    """An actor died more often than ``run.max_restarts`` within ``run.restart_window_s``."""


class RestartLimit:
    """At most ``max_restarts`` restarts of one actor within ``window_s`` seconds, spaced out: the first restart of
    an actor within the window is at once, and each next one waits until ``backoff_s``, then twice as long, ...
    (at most ``MAX_BACKOFF_S``) have passed since its previous restart. ``clock``: seconds, monotonic."""

    def __init__(self, max_restarts: int, window_s: float, backoff_s: float, clock=time.monotonic):
        self.max_restarts, self.window_s, self.backoff_s, self.clock = max_restarts, window_s, backoff_s, clock
        self.times: dict[str, list[float]] = {}  # actor -> when it was restarted, within the window

    def delay(self, name: str) -> float:
        """Seconds to wait before restarting ``name`` now; ``RestartsExhausted`` (the reason) past the limit."""
        now = self.clock()
        recent = self.times[name] = [t for t in self.times.get(name, []) if now - t < self.window_s]
        if len(recent) >= self.max_restarts:
            raise RestartsExhausted(f"{name} died again after {len(recent)} restarts within {self.window_s:g} s "
                                    f"(run.max_restarts={self.max_restarts}, run.restart_window_s={self.window_s:g})")
        if not recent:
            return 0.0
        wait = min(self.backoff_s * 2 ** (len(recent) - 1), MAX_BACKOFF_S)
        return max(recent[-1] + wait - now, 0.0)

    def restarted(self, name: str) -> None:
        self.times.setdefault(name, []).append(self.clock())


def restart_env(cluster, name: str, incarnation: int, replays: dict[str, str], training: bool,
                evaluations=()) -> None:
    """Start env actor ``name`` again. Its episodes in flight died with it: its successor counts what it delivered
    to each member's replay (``replays``: member -> replay actor) as started (admission) and starts new ones in
    their place, starts training if the run is training, and plays again its share of each of ``evaluations``
    (``evaluations.Evaluation``) under way."""
    delivered = {member: handle(cluster, replay, ReplayFace).statistics()["received_by_source"].get(name, 0)
                 for member, replay in replays.items()}
    cluster.restart(name, incarnation=incarnation, started_before=delivered)
    if training:
        handle(cluster, name, EnvFace).set_training(True)
    for evaluation in evaluations:
        evaluation.restarted(name)


def statistics_or_recover(cluster, names, recover) -> dict[str, Any]:
    """Every actor's statistics, by name (each its kind's: ``EnvStatistics``, ``LearnerStatistics``, ...): the
    run's health check. An actor found dead is handed to ``recover(name, error)``, which restarts it (or raises)
    and returns what stands in for its statistics. A cluster with a ``liveness`` (``RayCluster``) is asked for all
    at once, within its deadline (`Liveness`): an actor silent ``misses`` checks in a row is hung, its stacks are
    logged and it is handed to ``recover`` as a dead one is (a ``HungActor``)."""
    liveness: Liveness | None = getattr(cluster, "liveness", None)
    answers = cluster.statistics_within(names) if liveness is not None else {}
    stats, restarted = {}, False
    for name in names:
        try:
            if liveness is None:
                answer = cluster.statistics(name)
            elif restarted:  # a restart may have started this one again too (a learner group restarts whole)
                answer = cluster.statistics_within([name])[name]
            else:
                answer = answers[name]
            if isinstance(answer, Exception):
                raise answer
            if isinstance(answer, str) and answer == NO_ANSWER:
                stats[name] = _stand_in(cluster, liveness, name)  # or HungActor, restarted as a dead one is
                continue
            stats[name] = answer
        except Exception as error:
            if not (isinstance(error, HungActor) or cluster.is_dead(error)):
                raise
            stats[name] = recover(name, error)
            restarted = True
        if liveness is not None:
            liveness.answered(name, stats[name])
    return stats


def _stand_in(cluster, liveness: Liveness, name: str):
    """What stands in for the statistics of ``name``, which did not answer this check: its last ones; once it has
    been silent ``liveness.misses`` checks in a row, its stacks are asked for and ``HungActor`` is raised."""
    missed = liveness.missed[name] = liveness.missed.get(name, 0) + 1
    if missed < liveness.misses:
        log.warning("%s did not answer the health check within %g s (%d in a row; run.ping_misses=%d restarts it)",
                    name, liveness.timeout_s, missed, liveness.misses)
        if name in liveness.last:
            return liveness.last[name]
        return cluster.statistics(name)  # it never answered one yet: only its start (just now) says it runs
    cluster.log_stacks(name)
    liveness.missed.pop(name)
    error = HungActor(f"{name} answered none of its last {missed} health checks within {liveness.timeout_s:g} s "
                      f"each (run.ping_timeout_s, run.ping_misses): hung, so it is restarted as if dead")
    log.error("%s", error)
    raise error


class GroupRecovery:
    """Restarts the actors of one member's ``group`` (a ``topology.Group``), whose env actors are ``envs``."""

    def __init__(self, cluster, group, envs: list[str]):
        self.cluster, self.top, self.envs, self.policy_dir = cluster, group, envs, Path(group.policy_dir)
        self.learner_life = 0  # the learner's starts in this life of the run, less one (its announcements' life)
        self.learner_starts: list[dict] = []  # each restart of the learner: its life and the version it started at

    def restart(self, name: str) -> dict:
        """Start ``name`` (one of this group's actors) again; what its start returned (its addresses)."""
        top = self.top
        if name in top.rollouts:
            return self._restart_rollout(name)
        if name in top.learner_group():
            return self._restart_learner()
        started = self.cluster.restart(name)
        if name == top.replay:
            self.rewind_replay(handle(self.cluster, top.learner, LearnerFace).statistics()["cursor"])
        return started  # reward: its env actors send again what it had not acknowledged

    def _restart_rollout(self, name: str) -> dict:
        """At its old address; the env actors send again their unanswered requests (which only it knew)."""
        started = self.cluster.restart(name)
        reissued = sum(call_unless_dead(handle(self.cluster, env, EnvFace).reissue) or 0 for env in self.envs)
        log.warning("%s restarted; %d unanswered generation requests sent again", name, reissued)
        return started

    def _restart_learner(self) -> dict:
        """From its last checkpoint (or the base model, if it made none yet); replay sends again, in order, the
        batches after the checkpoint's data cursor, so it trains on each once. A learner group (any of its ranks
        died) starts again as a whole: the others wait in collectives that the dead one will never join. It is a
        new life: its followers take its versions, even below its predecessor's."""
        from actors.models.checkpoint_dir import find_checkpoint

        resume = find_checkpoint(self.policy_dir) is not None
        self.learner_life += 1
        started = self.cluster.restart(self.top.learner, resume=resume, life=self.learner_life)
        for rank in self.top.learner_ranks:
            self.cluster.restart(rank, rendezvous=started["rendezvous"])
        self.learner_starts.append({"life": self.learner_life, "version": started["version"]})
        log.warning("%s restarted at version %d (life %d); batches after %d come again", self.top.learner,
                    started["version"], self.learner_life, started["cursor"])
        self.rewind_replay(started["cursor"])
        return started

    def rewind_replay(self, cursor: int) -> None:
        replay = handle(self.cluster, self.top.replay, ReplayFace)
        call_unless_dead(replay.rewind, cursor)  # dead too: its own restart rewinds it
