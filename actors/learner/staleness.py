"""The staleness bound as the learner sets it, fixed or adapted to each batch.

**The bound moves with the versions.** Each version v is announced with its bound η_v (``VersionAnnounced.eta``);
env actors admit training episodes against the newest one heard. A token sampled with the weights of version s
may be trained on until the learner reaches version s + η_s, and no later (`StalenessBound.within`): that is the
bound, exact at every moment, however η moves. η moves by at most one version per update, so s + η_s never
decreases in s, and a turn's oldest token is the one that binds. (A sudden drop would strand episodes admitted
under the old bound: nothing trainable left in flight, no new one admitted, a run waiting for ever.)

**Auto** (``learner.max_staleness=auto``): η starts at ``start`` and follows the effective sample size of the
batch's importance weights w = π_prox/μ, normalised to (0, 1] (``is_ess``: (Σw)² / (n Σw²), 1 when every token's
behaviour policy is the proximal one): η grows by one after ``grow_after`` batches in a row with ``is_ess`` at
or above ``ess_grow`` (the correction holds), and falls by one after each batch below ``ess_shrink`` (it
strains), between ``min`` and ``max``.

**During the collapse guard's cooldown** (``actors/learner/guard.py``) η goes down to its floor (``min``, or 0
when fixed), by one a version: the bound asks the guard whether it is cooling down.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from actors.learner.guard import CollapseGuard
from streams.schema import Columns

log = logging.getLogger(__name__)
AUTO = "auto"
REJECTED_LOG_EVERY_S = 30.0  # at most one log line this often about turns dropped as too stale
STATE_KEYS = ("eta", "etas", "grow_streak")  # what a checkpoint keeps


@dataclass
class AutoStaleness:
    """``learner.max_staleness=auto``: where η may go, and what moves it (see the module)."""

    min: int = 0
    max: int = 4
    start: int = 2
    ess_grow: float = 0.95
    ess_shrink: float = 0.8
    grow_after: int = 2

    def __post_init__(self):
        if not 0 <= self.min <= self.start <= self.max:
            raise ValueError(f"auto staleness needs 0 <= min <= start <= max, not {self.min}, {self.start}, {self.max}")
        if not 0.0 < self.ess_shrink <= self.ess_grow <= 1.0:
            raise ValueError(f"auto staleness needs 0 < ess_shrink <= ess_grow <= 1, not {self.ess_shrink}, "
                             f"{self.ess_grow}")
        if self.grow_after < 1:
            raise ValueError(f"grow_after must be >= 1, not {self.grow_after}")


def parse_max_staleness(value) -> int | None:
    """``learner.max_staleness``: an int >= 0, or None for ``auto``; ValueError naming the setting otherwise."""
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"learner.max_staleness must be an integer >= 0 or 'auto', not {value!r}")
    return value


@dataclass
class StalenessBound:
    """The learner's bound per version and the auto controller that moves it; its ``state`` is plain data for the
    learner's checkpoint.

    ``fixed``: η when not auto. ``eta`` is the bound of the version the learner is at now. ``guard``: the collapse
    guard whose cooldown takes η down to its floor (None: no guard)."""

    fixed: int | None
    auto: AutoStaleness = field(default_factory=AutoStaleness)
    guard: CollapseGuard | None = None
    eta: int = -1
    etas: dict[int, int] = field(default_factory=dict)  # version -> its bound, the recent ones
    grow_streak: int = 0  # auto: batches in a row whose is_ess says η may grow

    def __post_init__(self):
        self._rejected_logged: tuple[float, int] | None = None
        self.dropped: list[list] = []  # the turns the last drop_stale dropped: [episode, agent, turn]
        if self.eta < 0:
            self.eta = self.auto.start if self.fixed is None else self.fixed

    @property
    def ceiling(self) -> int:
        """The largest bound any version can have (what a token of an unknown version is allowed)."""
        return self.auto.max if self.fixed is None else self.fixed

    @property
    def floor(self) -> int:
        """Where η goes during the guard's cooldown."""
        return self.auto.min if self.fixed is None else 0

    def published(self, version: int) -> int:
        """``version`` goes out now, with the current bound (returned)."""
        self.etas[version] = self.eta
        for old in [v for v in self.etas if v < version - 4 * max(self.ceiling, 1) - 8]:
            del self.etas[old]  # a token that old is out of any bound anyway
        return self.eta

    def allowance(self, version: int) -> int:
        """The bound ``version`` went out with (a version not heard of: the largest there can be)."""
        return self.etas.get(version, self.ceiling)

    def within(self, learner_version: int, token_version: int) -> bool:
        """May a token of ``token_version`` be trained on at ``learner_version``?"""
        return learner_version - token_version <= self.allowance(token_version)

    def drop_stale(self, table, version: int, totals: dict):
        """``table`` without the turns holding a token past its bound at ``version`` (None: nothing is left); the
        dropped ones counted in ``totals`` (rejected_turns, _tokens, and _episodes: those left with no turn) and
        named in ``self.dropped`` (episode, agent, turn: the ledger's record).

        A turn is a row: the bound is on tokens, so an episode whose first turns waited too long (a slow tool, a
        long game) keeps its later turns, sampled with newer weights; their returns-to-go do not depend on the
        earlier turns' rows."""
        versions = table.column(Columns.POLICY_VERSIONS).to_pylist()
        keep = [not v or self.within(version, min(v)) for v in versions]
        self.dropped = []
        if all(keep):
            return table
        episodes = table.column(Columns.EPISODE_ID).to_pylist()
        self.dropped = [[e, a, t] for e, a, t, k in zip(episodes, table.column(Columns.AGENT).to_pylist(),
                                                        table.column(Columns.TURN).to_pylist(), keep) if not k]
        kept = {e for e, k in zip(episodes, keep) if k}
        totals["rejected_episodes"] += len(set(episodes) - kept)
        totals["rejected_turns"] += keep.count(False)
        totals["rejected_tokens"] += sum(len(v) for v, k in zip(versions, keep) if not k)
        now = time.monotonic()
        since, before = self._rejected_logged or (now - REJECTED_LOG_EVERY_S, 0)
        if now - since >= REJECTED_LOG_EVERY_S:  # a line now and then: it can happen at many updates
            log.info("dropped %d turns past the staleness bound (now %d) in the last %.0f s (%d in all; learner at "
                     "version %d)", totals["rejected_turns"] - before, self.eta, now - since, totals["rejected_turns"],
                     version)
            self._rejected_logged = (now, totals["rejected_turns"])
        return table.filter(keep) if any(keep) else None

    def observe(self, ess: float | None) -> int:
        """After an update (and after the guard's move on it): η's move, at most one version, given the batch's
        ``is_ess``. Returns the bound the next version goes out with."""
        self.eta = self._next_eta(ess)
        return self.eta

    def state(self) -> dict:
        """The bound's part of a checkpoint's ``staleness_control`` (the guard's keys are beside it)."""
        return {"eta": self.eta, "etas": dict(self.etas), "grow_streak": self.grow_streak}

    def restore(self, state: dict | None) -> None:
        """The bound's keys of a checkpoint's ``staleness_control``, its versions and bounds as ints (None: a
        checkpoint from before the bound moved)."""
        state = state or {}
        for key in STATE_KEYS:
            if key in state:
                value = state[key]
                setattr(self, key, {int(v): int(e) for v, e in value.items()} if key == "etas" else value)

    def _next_eta(self, ess: float | None) -> int:
        """One step (at most one version) towards where η should be now."""
        if self.guard is not None and self.guard.cooling_down:
            target = self.floor
        elif self.fixed is not None:
            target = self.fixed
        else:
            target = self.eta
            if ess is not None and ess < self.auto.ess_shrink:
                target, self.grow_streak = self.eta - 1, 0
            elif ess is not None and ess >= self.auto.ess_grow:
                self.grow_streak += 1
                if self.grow_streak >= self.auto.grow_after:
                    target, self.grow_streak = self.eta + 1, 0
            else:
                self.grow_streak = 0
            target = min(max(target, self.auto.min), self.auto.max)
        return self.eta + max(-1, min(1, target - self.eta))
