"""The collapse guard: it watches each batch for a run falling into an absorbing state, and says how to react.

A batch's invalid-action share ``invalid_rise`` above its healthy reference (an average over the batches that were
healthy), or ``is_ess`` under ``ess_floor``, for ``patience`` batches in a row, is a trip. A trip is counted
(``guard_trips``) and logged, and for ``cooldown`` updates the learner steps at ``step_scale`` times its learning
rate and the staleness bound goes down to its floor, by one a version (the ``StalenessBound`` asks the guard
whether it is ``cooling_down``: ``actors/learner/staleness.py``). With ``rollback`` the learner first goes back to
its anchor, the weights it had at a healthy version at least ``anchor_every`` versions before (published as the
next version, optimizer fresh). The guard keeps the anchors' versions, the learner's ``Trainer`` their weights.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


@dataclass
class Guard:
    """The collapse guard's settings (``learner.guard``; see the module)."""

    enabled: bool = True
    invalid_rise: float = 0.1
    ess_floor: float = 0.3
    patience: int = 2
    cooldown: int = 20
    step_scale: float = 0.5
    rollback: bool = True
    anchor_every: int = 10
    reference_decay: float = 0.9
    trip_at: tuple[int, ...] = ()  # fault injection (tests, benchmarks/replay.py): trip after the updates that make
    # these versions, whatever their batches look like

    def __post_init__(self):
        self.trip_at = tuple(self.trip_at)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in self.trip_at):
            raise ValueError(f"guard trip_at lists versions (whole numbers > 0), not {self.trip_at!r}")
        if not 0.0 < self.invalid_rise <= 1.0 or not 0.0 <= self.ess_floor < 1.0:
            raise ValueError(f"guard needs 0 < invalid_rise <= 1 and 0 <= ess_floor < 1, not {self.invalid_rise}, "
                             f"{self.ess_floor}")
        if self.patience < 1 or self.cooldown < 0 or self.anchor_every < 1:
            raise ValueError("guard needs patience >= 1, cooldown >= 0 and anchor_every >= 1")
        if not 0.0 < self.step_scale <= 1.0 or not 0.0 <= self.reference_decay < 1.0:
            raise ValueError("guard needs 0 < step_scale <= 1 and 0 <= reference_decay < 1")


STATE_KEYS = ("trips", "cooldown_left", "suspicious", "invalid_reference", "last_reason")  # what a checkpoint keeps


@dataclass
class CollapseGuard:
    """The guard over a run: its trips, its cooldown, its suspicion and the versions of the anchors held. Its
    ``state`` is plain data for the learner's checkpoint (the anchors are not in it: their weights are not)."""

    config: Guard = field(default_factory=Guard)
    trips: int = 0
    cooldown_left: int = 0
    suspicious: int = 0  # batches in a row that looked like a collapse
    invalid_reference: float | None = None
    anchors: list[int] = field(default_factory=list)  # versions of the anchors held, oldest first
    last_reason: str = ""

    @property
    def cooling_down(self) -> bool:
        """Is the learner in a trip's cooldown (a smaller step, the staleness bound at its floor)?"""
        return self.cooldown_left > 0

    @property
    def step_scale(self) -> float:
        """What the learning rate is multiplied by now."""
        return self.config.step_scale if self.cooling_down else 1.0

    def observe(self, version: int, invalid_share: float | None, ess: float | None, turns: int = 0,
                eta_floor: int = 0) -> dict:
        """After the update that made ``version``, from its batch of ``turns`` turns: the guard's move. Returns
        what the learner reports, with ``rollback`` True when it should go back to its anchor now. ``eta_floor``
        is where the staleness bound goes during the cooldown (for the log line)."""
        rollback = False
        if self.cooldown_left > 0:
            self.cooldown_left -= 1
        reason = self._suspicion(invalid_share, ess, turns) if self.config.enabled else ""
        self.suspicious = self.suspicious + 1 if reason else 0
        forced = self.config.enabled and version in self.config.trip_at
        if forced:
            reason, self.suspicious = f"forced at version {version} (guard.trip_at)", self.config.patience
        if reason and self.suspicious >= self.config.patience and self.cooldown_left == 0:
            self.trips += 1
            self.cooldown_left = self.config.cooldown
            self.suspicious = 0
            self.last_reason = reason
            rollback = self.config.rollback and bool(self.anchors)
            log.warning("guard: the run looks like it is collapsing at version %d (%s); for %d updates the step is "
                        "x%.2f and the staleness bound goes down to %d%s", version, reason, self.config.cooldown,
                        self.config.step_scale, eta_floor, ", from the anchor of version %d" % self.anchors[0]
                        if rollback else "")
        return {"guard_trips": self.trips, "guard_cooldown": self.cooldown_left, "step_scale": self.step_scale,
                "rollback": rollback}

    def anchor_due(self, version: int, invalid_share: float | None, ess: float | None, turns: int = 0) -> bool:
        """Should the weights of ``version`` become the newest anchor? (A healthy batch, every anchor_every.)"""
        if not (self.config.enabled and self.config.rollback) or self.cooldown_left or self.suspicious:
            return False
        return version % self.config.anchor_every == 0 and not self._suspicion(invalid_share, ess, turns,
                                                                               strict=False)

    def anchored(self, version: int) -> None:
        """The learner holds the weights of ``version`` as an anchor (it keeps the last two)."""
        self.anchors = [*self.anchors, version][-2:]

    def state(self) -> dict:
        """The guard's part of a checkpoint's ``staleness_control`` (the bound's keys are beside it)."""
        return {key: getattr(self, key) for key in STATE_KEYS}

    def restore(self, state: dict | None) -> None:
        """The guard's keys of a checkpoint's ``staleness_control`` (None: a checkpoint from before the guard)."""
        state = state or {}
        for key in STATE_KEYS:
            if key in state:
                setattr(self, key, state[key])

    def _suspicion(self, invalid_share: float | None, ess: float | None, turns: int = 0, strict: bool = True) -> str:
        """Why this batch looks like a collapse ("" if it does not); a healthy one moves the invalid reference.

        A rise counts when it is ``invalid_rise`` and, for a batch of ``turns`` turns, three standard deviations of
        the share's sampling noise at the reference: a small batch's share jumps by chance."""
        reasons = []
        if invalid_share is not None:
            reference = self.invalid_reference if self.invalid_reference is not None else invalid_share
            p = min(max(reference, 0.05), 0.95)
            rise = max(self.config.invalid_rise, 3.0 * (p * (1 - p) / turns) ** 0.5 if turns else 0.0)
            if invalid_share >= reference + (rise if strict else rise / 2):
                reasons.append(f"invalid actions {invalid_share:.2f} against {reference:.2f} when healthy")
            elif strict:
                d = self.config.reference_decay
                self.invalid_reference = invalid_share if self.invalid_reference is None else \
                    d * self.invalid_reference + (1 - d) * invalid_share
        if ess is not None and ess < self.config.ess_floor:
            reasons.append(f"importance-weight ESS {ess:.2f} under {self.config.ess_floor}")
        return "; ".join(reasons)
