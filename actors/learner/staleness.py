"""The staleness bound as the learner sets it, fixed or adapted to each batch, and the guard against collapse.

**The bound moves with the versions.** Each version v is announced with its bound η_v (``VersionAnnounced.eta``);
env actors admit training episodes against the newest one heard. A token sampled with the weights of version s
may be trained on until the learner reaches version s + η_s, and no later (`StalenessControl.within`): that is the
bound, exact at every moment, however η moves. η moves by at most one version per update, so s + η_s never
decreases in s, and a turn's oldest token is the one that binds. (A sudden drop would strand episodes admitted
under the old bound: nothing trainable left in flight, no new one admitted, a run waiting for ever.)

**Auto** (``learner.max_staleness=auto``): η starts at ``start`` and follows the effective sample size of the
batch's importance weights w = π_prox/μ, normalised to (0, 1] (``is_ess``: (Σw)² / (n Σw²), 1 when every token's
behaviour policy is the proximal one): η grows by one after ``grow_after`` batches in a row with ``is_ess`` at
or above ``ess_grow`` (the correction holds), and falls by one after each batch below ``ess_shrink`` (it
strains), between ``min`` and ``max``.

**The guard** watches each batch for a run falling into an absorbing state: a batch's invalid-action share
``invalid_rise`` above its healthy reference (an average over the batches that were healthy), or ``is_ess``
under ``ess_floor``, for ``patience`` batches in a row, is a trip. A trip is counted (``guard_trips``) and
logged, and for ``cooldown`` updates the learner steps at ``step_scale`` times its learning rate and η goes down
to ``min`` (by one a version); with ``rollback`` the learner first goes back to its anchor, the weights it had
at a healthy version at least ``anchor_every`` versions before (published as the next version, optimizer fresh).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field

from streams.schema import Columns

log = logging.getLogger(__name__)
AUTO = "auto"
REJECTED_LOG_EVERY_S = 30.0  # at most one log line this often about turns dropped as too stale


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


@dataclass
class Guard:
    """The collapse guard (see the module)."""

    enabled: bool = True
    invalid_rise: float = 0.1
    ess_floor: float = 0.3
    patience: int = 2
    cooldown: int = 20
    step_scale: float = 0.5
    rollback: bool = True
    anchor_every: int = 10
    reference_decay: float = 0.9

    def __post_init__(self):
        if not 0.0 < self.invalid_rise <= 1.0 or not 0.0 <= self.ess_floor < 1.0:
            raise ValueError(f"guard needs 0 < invalid_rise <= 1 and 0 <= ess_floor < 1, not {self.invalid_rise}, "
                             f"{self.ess_floor}")
        if self.patience < 1 or self.cooldown < 0 or self.anchor_every < 1:
            raise ValueError("guard needs patience >= 1, cooldown >= 0 and anchor_every >= 1")
        if not 0.0 < self.step_scale <= 1.0 or not 0.0 <= self.reference_decay < 1.0:
            raise ValueError("guard needs 0 < step_scale <= 1 and 0 <= reference_decay < 1")


def parse_max_staleness(value) -> int | None:
    """``learner.max_staleness``: an int >= 0, or None for ``auto``; ValueError naming the setting otherwise."""
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"learner.max_staleness must be an integer >= 0 or 'auto', not {value!r}")
    return value


@dataclass
class StalenessControl:
    """The learner's bound per version, the auto controller and the guard; its state is plain data (checkpoints).

    ``fixed``: η when not auto. ``eta`` is the bound of the version the learner is at now."""

    fixed: int | None
    auto: AutoStaleness = field(default_factory=AutoStaleness)
    guard: Guard = field(default_factory=Guard)
    eta: int = -1
    etas: dict[int, int] = field(default_factory=dict)  # version -> its bound, the recent ones
    trips: int = 0
    cooldown_left: int = 0
    suspicious: int = 0  # batches in a row that looked like a collapse
    invalid_reference: float | None = None
    grow_streak: int = 0
    anchors: list[int] = field(default_factory=list)  # versions of the anchors held, oldest first
    last_reason: str = ""

    def __post_init__(self):
        self._rejected_logged: tuple[float, int] | None = None
        if self.eta < 0:
            self.eta = self.auto.start if self.fixed is None else self.fixed

    @property
    def ceiling(self) -> int:
        """The largest bound any version can have (what a token of an unknown version is allowed)."""
        return self.auto.max if self.fixed is None else self.fixed

    @property
    def step_scale(self) -> float:
        return self.guard.step_scale if self.cooldown_left > 0 else 1.0

    def published(self, version: int) -> int:
        """``version`` goes out now, with the current bound (returned)."""
        self.etas[version] = self.eta
        for old in [v for v in self.etas if v < version - 4 * max(self.ceiling, 1) - 8]:
            del self.etas[old]  # a token that old is out of any bound anyway
        return self.eta

    def allowance(self, version: int) -> int:
        return self.etas.get(version, self.ceiling)

    def within(self, learner_version: int, token_version: int) -> bool:
        """May a token of ``token_version`` be trained on at ``learner_version``?"""
        return learner_version - token_version <= self.allowance(token_version)

    def drop_stale(self, table, version: int, totals: dict):
        """``table`` without the turns holding a token past its bound at ``version`` (None: nothing is left); the
        dropped ones counted in ``totals`` (rejected_turns, _tokens, and _episodes: those left with no turn).

        A turn is a row: the bound is on tokens, so an episode whose first turns waited too long (a slow tool, a
        long game) keeps its later turns, sampled with newer weights; their returns-to-go do not depend on the
        earlier turns' rows."""
        versions = table.column(Columns.POLICY_VERSIONS).to_pylist()
        keep = [not v or self.within(version, min(v)) for v in versions]
        if all(keep):
            return table
        episodes = table.column(Columns.EPISODE_ID).to_pylist()
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

    def observe(self, version: int, invalid_share: float | None, ess: float | None, turns: int = 0) -> dict:
        """After the update that made ``version``: the guard's and the controller's move. Returns what the learner
        reports, with ``rollback`` True when it should go back to its anchor now."""
        rollback = False
        if self.cooldown_left > 0:
            self.cooldown_left -= 1
        reason = self._suspicion(invalid_share, ess, turns) if self.guard.enabled else ""
        self.suspicious = self.suspicious + 1 if reason else 0
        if reason and self.suspicious >= self.guard.patience and self.cooldown_left == 0:
            self.trips += 1
            self.cooldown_left = self.guard.cooldown
            self.suspicious = 0
            self.last_reason = reason
            rollback = self.guard.rollback and bool(self.anchors)
            log.warning("guard: the run looks like it is collapsing at version %d (%s); for %d updates the step is "
                        "x%.2f and the staleness bound goes down to %d%s", version, reason, self.guard.cooldown,
                        self.guard.step_scale, self._floor(), ", from the anchor of version %d" % self.anchors[0]
                        if rollback else "")
        self.eta = self._next_eta(ess)
        return {"eta": self.eta, "is_ess": ess, "guard_trips": self.trips, "guard_cooldown": self.cooldown_left,
                "step_scale": self.step_scale, "rollback": rollback}

    def anchor_due(self, version: int, invalid_share: float | None, ess: float | None, turns: int = 0) -> bool:
        """Should the weights of ``version`` become the newest anchor? (A healthy batch, every anchor_every.)"""
        if not (self.guard.enabled and self.guard.rollback) or self.cooldown_left or self.suspicious:
            return False
        return version % self.guard.anchor_every == 0 and not self._suspicion(invalid_share, ess, turns, strict=False)

    def anchored(self, version: int) -> None:
        """The learner holds the weights of ``version`` as an anchor (it keeps the last two)."""
        self.anchors = [*self.anchors, version][-2:]

    def state(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k not in ("fixed", "auto", "guard", "anchors")}

    def restore(self, state: dict | None) -> None:
        for key, value in (state or {}).items():
            if key == "etas":
                value = {int(v): int(e) for v, e in value.items()}
            setattr(self, key, value)

    def _suspicion(self, invalid_share: float | None, ess: float | None, turns: int = 0, strict: bool = True) -> str:
        """Why this batch looks like a collapse ("" if it does not); a healthy one moves the invalid reference.

        A rise counts when it is ``invalid_rise`` and, for a batch of ``turns`` turns, three standard deviations of
        the share's sampling noise at the reference: a small batch's share jumps by chance."""
        reasons = []
        if invalid_share is not None:
            reference = self.invalid_reference if self.invalid_reference is not None else invalid_share
            p = min(max(reference, 0.05), 0.95)
            rise = max(self.guard.invalid_rise, 3.0 * (p * (1 - p) / turns) ** 0.5 if turns else 0.0)
            if invalid_share >= reference + (rise if strict else rise / 2):
                reasons.append(f"invalid actions {invalid_share:.2f} against {reference:.2f} when healthy")
            elif strict:
                d = self.guard.reference_decay
                self.invalid_reference = invalid_share if self.invalid_reference is None else \
                    d * self.invalid_reference + (1 - d) * invalid_share
        if ess is not None and ess < self.guard.ess_floor:
            reasons.append(f"importance-weight ESS {ess:.2f} under {self.guard.ess_floor}")
        return "; ".join(reasons)

    def _floor(self) -> int:
        return self.auto.min if self.fixed is None else 0

    def _next_eta(self, ess: float | None) -> int:
        """One step (at most one version) towards where η should be now."""
        if self.cooldown_left > 0:
            target = self._floor()
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
