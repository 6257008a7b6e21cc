"""Scaling a running run: rollout actors of any member, and env actors, joining or leaving while it trains.

A scale request (``tidal scale rollout=4``, the autoscaler, or the driver's own ``scale``) is queued from any
thread and carried out by the driver's loop, one at a time. ``rollout`` names the run's policy's rollout actors
(a league's first member), ``rollout-<member>`` a league member's. Joining actors start in a thread (loading a
model takes seconds): the loop goes on meanwhile and connects them once they are up. Leaving rollout actors are
disconnected first; once they are gone the env actors send again what they left unanswered. Env actors (of a
single-policy run; a league keeps admission per member and does not scale them yet) leave only between evaluations (each plays its share of one) and only once they delivered every episode they started;
then the admission allowance is shared again among those that stay, so the staleness bound holds exactly.
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from actors.env.admission import admission_share
from actors.env.face import EnvFace, EnvStatistics
from actors.observe.monitor import MetricsLog
from actors.runs.autoscale import autoscale_target
from actors.runs.config import RunConfig
from actors.runs.evaluations import Evaluations
from actors.runs.handles import call_unless_dead, handle
from actors.runs.recovery import statistics_or_recover
from actors.runs.topology import Topology, spawn_envs, spawn_rollouts

log = logging.getLogger(__name__)
DRAIN_TIMEOUT_S = 300.0  # how long leaving env actors may take to finish their episodes in flight


@dataclass
class ScaleContext:
    """What a scale needs of the run it changes, handed over by the driver once the run's actors are up."""

    cfg: RunConfig
    cluster: Any  # the run's cluster (``ray_cluster.open_cluster``): actors start and stop on it
    top: Topology  # changed in place: the recoveries and the evaluations hold its lists
    evaluations: Evaluations  # an env scale-down waits while one is open
    metrics: MetricsLog  # told of each actor that leaves
    restarts: dict[str, int]  # actor -> its restarts so far (the driver's own, kept up to date)
    recover: Callable[[str, Exception], dict]  # restarts a dead actor; what stands in for its statistics
    training: Callable[[], bool]  # whether the run lets env actors start training episodes now
    set_training: Callable[[bool, list[str] | None], None]  # lets those env actors (None: every one) train, or not


class Scaler:
    """The scale requests of the ``run`` (see ``ScaleContext``)."""

    def __init__(self, run: ScaleContext):
        self.run = run
        self.requests: queue.Queue = queue.Queue()  # (kind, count), from any thread
        self.events: list[dict] = []
        self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tidal-scale")
        self._joining: Future | None = None  # actors starting for the scale to ``_target``
        self._target: tuple[str, int] = ("", 0)  # (kind, count) of the scale under way
        self._deferred: tuple[str, int] | None = None  # an env scale-down waiting for an evaluation to end
        self._retiring: dict[str, int] = {}  # leaving env actors -> their restarts when told to retire
        self._retire_deadline = 0.0
        self._autoscale_history: list[tuple[int, float]] = []

    @property
    def busy(self) -> bool:
        """Actors are joining or leaving (no evaluation starts meanwhile)."""
        return self._joining is not None or bool(self._retiring)

    def check(self, kind: str, count: int) -> None:
        """Refuse a request that cannot be carried out, naming what is wrong."""
        top, mode = self.run.top, self.run.cfg.run.mode
        members = [f"rollout-{m}" for m in top.groups] if top.league is not None else []
        if kind not in ("rollout", "env", *members):
            raise ValueError(f"cannot scale {kind!r} actors: only {', '.join(('rollout', 'env', *members))} "
                             "actors can be scaled")
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ValueError(f"scale {kind}={count!r}: the count must be an integer >= 1")
        key, most = ("env.max_count", self.run.cfg.env.max_count) if kind == "env" else \
            ("rollout.max_count", self.run.cfg.rollout.max_count)
        if count > most:
            raise ValueError(f"scale {kind}={count}: this run allows at most {most} ({key}, set when the run "
                             "starts or resumes)")
        if mode != "ray":
            raise ValueError("scaling needs run.mode=ray (in one process no actor can leave)")
        if kind == "env" and top.league is not None:
            raise ValueError("a league's env actors cannot be scaled yet (their admission is kept per member); "
                             "scale its members' rollout actors")

    def actors(self, kind: str) -> list[str]:
        top = self.run.top
        if kind == "env":
            return top.envs
        return top.groups[self._member(kind)].rollouts

    def _member(self, kind: str) -> str:
        return kind.removeprefix("rollout-") if kind.startswith("rollout-") else next(iter(self.run.top.groups))

    def apply(self) -> None:
        """Carry out the scale requests, one at a time (see the module's docstring)."""
        if self._retiring:
            if not self._retired():
                return
            self._set_count(*self._target, [])
        if self._joining is not None:
            if not self._joining.done():
                return
            joined = self._joining.result()  # raises what a failed start raised
            self._joining = None
            self._set_count(*self._target, joined)
        while self._joining is None and not self._retiring and (self._deferred or not self.requests.empty()):
            kind, count = self._deferred or self.requests.get()
            before = len(self.actors(kind))
            if kind == "env" and count < before and self.run.evaluations.open:
                self._deferred = (kind, count)
                return
            self._deferred, self._target = None, (kind, count)
            self.events.append({"time": time.time(), "kind": kind, "from": before, "to": count})
            log.warning("scaling %s actors from %d to %d", kind, before, count)
            if count > before:
                start = self._start_envs if kind == "env" else self._start_rollouts
                self._joining = self._spawner.submit(start, kind, count - before)
            elif kind == "env" and count < before:  # the leaving ones first deliver what they started
                self._retiring = dict.fromkeys(self.run.top.envs[count:], -1)
                self._retire_deadline = time.monotonic() + DRAIN_TIMEOUT_S
                self._retired()
            else:
                self._set_count(kind, count, [])

    def autoscale(self, row: dict) -> None:
        """With ``rollout.autoscale.enabled``: one step towards the rollout actors the queue asks for."""
        settings = self.run.cfg.rollout.autoscale
        if not settings.enabled or self._joining is not None or not self.requests.empty():
            return
        self._autoscale_history.append((row.get("queue_requests", 0), row.get("rollout_idle", 0.0)))
        actors = len(self.actors("rollout"))
        target = autoscale_target(settings, actors, self._autoscale_history)
        if target != actors:
            log.warning("autoscale: %d rollout actors -> %d (requests waiting, idle: %s)", actors, target,
                        self._autoscale_history[-settings.patience:])
            self.requests.put(("rollout", target))
            self._autoscale_history = []

    def close(self) -> None:
        self._spawner.shutdown(wait=True)

    def _set_count(self, kind: str, count: int, joined: list[str]) -> None:
        if kind == "env":
            self._set_envs(count, joined)
        else:
            self._set_rollouts(self._member(kind), count)
        log.warning("%d %s actors serve the run", count, kind)
        self.events[-1]["applied"] = time.time()  # from now on ``count`` actors serve

    def _start_rollouts(self, kind: str, joining: int) -> list[str]:
        spawn_rollouts(self.run.cluster, self.run.cfg, self.run.top, {self._member(kind): joining})
        return []

    def _start_envs(self, kind: str, joining: int) -> list[str]:
        """Env actors with names never used, not training yet: ``_set_envs`` gives them their shares."""
        top = self.run.top
        made = max(top.envs_made, len(top.envs))
        top.envs_made = made + joining
        return spawn_envs(self.run.cluster, self.run.cfg, top, [(f"env-{i}", i, (0, 1))
                                                                for i in range(made, top.envs_made)])

    def _set_envs(self, count: int, joined: list[str]) -> None:
        """Env actors: the ``joined`` ones come in, or the last ones (retired, see ``_retired``) go. Then the
        admission allowance is shared again among the ``count`` that stay: with training paused, the episodes
        counted as started by all of them, the leaving ones included, are spread over the new shares, each
        actor's count moving by the difference, so the counts still add up to the run's total and the staleness
        bound holds exactly."""
        run, top, cluster = self.run, self.run.top, self.run.cluster
        top.envs.extend(joined)  # in place: the recoveries and the evaluations hold this list
        keep, leaving = top.envs[:count], top.envs[count:]
        training = run.training()
        run.set_training(False, keep)  # an actor restarted meanwhile waits too
        stats: dict[str, EnvStatistics] = statistics_or_recover(cluster, top.envs, run.recover)
        total = sum(s["started"] for s in stats.values())
        for i, name in enumerate(keep):
            delta = admission_share(total, i, count) - stats[name]["started"]
            # a restart of it from now on counts what ``rebalance`` makes its count (offset + delivered)
            cluster.reconfigure(name, admission_slot=(i, count),
                                admission_offset=stats[name]["admission_offset"] + delta)
            call_unless_dead(handle(cluster, name, EnvFace).rebalance, (i, count), delta)
        for name in leaving:
            cluster.stop(name)
            run.metrics.retired(name)
        top.envs[:] = keep
        self._retiring = {}
        run.set_training(training, None)

    def _retired(self) -> bool:
        """Whether every leaving env actor has delivered (or given back) each episode it started, after it was
        told to ``retire``; one restarted since is told again. The run's loop goes on meanwhile (health checks,
        metrics), only no evaluation starts."""
        run, restarts = self.run, self.run.restarts
        for name, told in self._retiring.items():
            if told != restarts.get(name, 0):
                call_unless_dead(handle(run.cluster, name, EnvFace).retire)
                self._retiring[name] = restarts.get(name, 0)
        stats: dict[str, EnvStatistics] = statistics_or_recover(run.cluster, list(self._retiring), run.recover)
        if all(s["drained"] for s in stats.values()):
            return True
        if time.monotonic() > self._retire_deadline:
            raise TimeoutError(f"the leaving env actors {list(self._retiring)} did not finish their episodes in "
                               f"flight within {DRAIN_TIMEOUT_S:.0f} s")
        return False

    def _set_rollouts(self, member: str, count: int) -> None:
        """Env actors send ``member``'s requests to its first ``count`` rollout actors (joining ones take the
        latest weights, which the learner announces every second); the others go: once they are gone, env actors
        send again what they left unanswered (an answer that still comes is counted once)."""
        run, group = self.run, self.run.top.groups[member]
        leaving, group.rollouts[:] = group.rollouts[count:], group.rollouts[:count]
        addresses = [group.requests[name] for name in group.rollouts]
        for env in run.top.envs:
            run.cluster.set_peers(env, "rollout", addresses, member)  # first: a restart connects to these
            call_unless_dead(handle(run.cluster, env, EnvFace).set_rollouts, addresses, member)
        for name in leaving:
            run.cluster.stop(name)
            group.requests.pop(name)
            run.metrics.retired(name)
        if leaving:
            reissued = sum(call_unless_dead(handle(run.cluster, env, EnvFace).reissue) or 0 for env in run.top.envs)
            log.warning("%d unanswered generation requests of the leaving rollout actors sent again", reissued)
