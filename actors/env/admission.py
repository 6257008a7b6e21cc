"""Admission: when an env actor may start a training episode. The staleness bound rests on it.

AReaL's rule: a new training episode for a learning member starts only while the episodes started for it but
not yet consumed by its learner number fewer than (max_staleness + v + 1) * batch_episodes, v being that
learner's version (announced on its publisher). Counting from the run's start, the learner has consumed
v * batch_episodes by version v, so at most (max_staleness + 1) batches are ever in flight: the oldest
episode started is at most max_staleness versions behind when it is trained on.

With n env actors the allowance A is split exactly: actor i of n gets ceil((A - i) / n) of it
(``admission_share``), so the shares add up to A; a scale of env actors shares it again (``rebalance``:
each actor's count moves by what the launcher computed, so the counts still add up to the run's total).

A resumed run starts at the learner's checkpoint version: its own count starts at its share of
start_version * batch_episodes (what the learner consumed before this life), or at ``offset`` when the
launcher says (after a rebalance). A restarted env actor also counts as started what its predecessors
delivered (``started_before``, per member, from replay): their episodes still in flight died with them and
are replaced by new ones. In a league, admission is kept per member, against that member's learner version.

The version is the live learner's: a learner restarted from an older checkpoint is a new life, and its lower
version is taken (the limit shrinks until it has retrained what its predecessor had; nothing started is lost).

Every episode started is accounted to the end: consumed by the learner, or given back with its reason
(``given_back``; ``given_back_by_reason`` in the statistics): ``errored`` in the env (a refused generation or a
lost completion included), ``without_rows`` (over before the learner's turn), or dropped after its delivery, as
the reward actor or replay say in a drop notice (``unscored``, ``rejected_by_reward``, ``rejected_by_replay``,
``refused_by_replay``: ``streams.drop_notices``). An episode never consumed and never given back would hold its
place for good: at max_staleness 0 one such episode stops the run.
"""

from __future__ import annotations

import trio

from streams.endpoints import Inbox


def admission_share(allowance: int, i: int, n: int) -> int:
    """Env actor i of n's share of ``allowance`` A: the episodes k < A with k mod n = i, ceil((A - i) / n). The n
    shares add up to exactly A, and none shrinks as A grows (so a count spread as shares of a total within the
    allowance stays within each share)."""
    return (allowance - i + n - 1) // n


class Admission:
    """Per learning member: its learner's version and the training episodes started and not given back, and
    whether one more may start (see the module). ``own`` is the env actor's policy, the one a rebalance moves."""

    def __init__(self, own: str, *, max_staleness: int, batch_episodes: int, slot: tuple[int, int] = (0, 1),
                 versions: dict[str, int] | None = None, offset: int | None = None,
                 started_before: dict[str, int] | None = None):
        self.own, self.max_staleness, self.batch_episodes = own, max_staleness, batch_episodes
        self.slot = _checked(slot)
        self._versions = dict(versions or {own: 0})
        self._lives: dict[str, int] = {}  # member -> the newest life of its learner announced
        self._etas: dict[str, int] = {}  # member -> the staleness bound its learner announced last
        self._started = {m: self._share(v * batch_episodes) for m, v in self._versions.items()}
        if offset is not None:
            self._started[own] = offset
        self.offset = self._started[own]  # what a restart counts beyond the episodes it delivered
        for member, delivered in (started_before or {}).items():
            self._started[member] += delivered
        self.waits = 0  # times nothing could be admitted
        self.given_back_by_reason: dict[str, int] = {}
        self._changed = trio.Event()

    @property
    def members(self) -> list[str]:
        return list(self._started)

    def version(self, member: str) -> int:
        return self._versions.get(member, 0)

    def limit(self, member: str) -> int:
        """How many training episodes of ``member`` this actor may have started: its share of the allowance."""
        return self._share((self.eta(member) + self._versions[member] + 1) * self.batch_episodes)

    def eta(self, member: str) -> int:
        """The staleness bound for ``member`` now: its learner's last word, else the configured one."""
        return self._etas.get(member, self.max_staleness)

    def admitted(self) -> list[str]:
        """The members a training episode may start for now."""
        return [m for m, started in self._started.items() if started < self.limit(m)]

    async def wait_for_change(self) -> None:
        """Wait until admission may have moved (a new version, new shares, an episode given back)."""
        self.waits += 1
        await self._changed.wait()

    def started(self, member: str) -> None:
        self._started[member] += 1

    def given_back(self, member: str, reason: str) -> None:
        """An episode started for ``member`` that will never be consumed (errored, without rows, dropped after
        its delivery: ``reason``): its place reopens at once, for the learner may wait on a replacement before it
        publishes a new version."""
        self._started[member] -= 1
        self.given_back_by_reason[reason] = self.given_back_by_reason.get(reason, 0) + 1
        self._moved()

    def set_version(self, member: str, version: int) -> None:
        """``member``'s learner is at ``version`` (the driver's say, or a resume's)."""
        self._versions[member] = version
        self._moved()

    def version_announced(self, member: str, version: int, life: int | None = None, eta: int = -1) -> None:
        """``member``'s learner published ``version`` in its ``life``: a newer version of the life known widens its
        limit; a newer life's version is taken even when lower (a learner restarted from an older checkpoint: its
        predecessor's versions are nobody's any more). The first life heard of is taken as it is. A member not
        admitted here, or an older life, changes nothing. ``eta`` (>= 0) is the bound the learner holds to now
        (it moves by at most one a version: actors/learner/staleness.py)."""
        if member not in self._versions:
            return
        known = self._lives.get(member)
        if eta >= 0 and (life is None or known is None or life >= known) and eta != self._etas.get(member):
            self._etas[member] = eta
            self._moved()
        if life is not None and (known is None or life > known):
            self._lives[member] = life
            self.set_version(member, version)
        elif (life is None or life == known) and version > self._versions[member]:
            self.set_version(member, version)

    async def follow_versions(self, inbox: Inbox) -> None:
        """Take each version announced on ``inbox`` (``VersionAnnounced``), for ever."""
        while True:
            announced = await inbox.receive()
            self.version_announced(announced.policy_id, announced.version, announced.life, announced.eta)

    def rebalance(self, slot: tuple[int, int], delta: int) -> int:
        """A scale of env actors: from now on this actor is ``slot`` = (i, n) of the n sharing the allowance,
        and its own count of started episodes moves by ``delta`` (the launcher spreads the run's total over the
        new shares, training paused meanwhile, so the shares still add up to the total exactly). Returns its
        offset, what a restart of it counts beyond the episodes it delivered."""
        self.slot = _checked(slot)
        self._started[self.own] += delta
        self.offset += delta
        self._moved()
        return self.offset

    def statistics(self) -> dict:
        return {"admission_waits": self.waits, "started": sum(self._started.values()), "admission_offset": self.offset,
                "admission_slot": list(self.slot), "learner_version": self.version(self.own),
                "admission_limit": sum(map(self.limit, self._started)), "versions": dict(self._versions),
                "etas": {m: self.eta(m) for m in self._started},
                "learner_lives": dict(self._lives), "given_back_by_reason": dict(self.given_back_by_reason)}

    def _share(self, allowance: int) -> int:
        """This actor's exact share of ``allowance`` among the env actors."""
        return admission_share(allowance, *self.slot)

    def _moved(self) -> None:
        """Wake whoever waits for admission."""
        self._changed.set()
        self._changed = trio.Event()


def _checked(slot: tuple[int, int]) -> tuple[int, int]:
    i, n = slot
    if not 0 <= i < n:
        raise ValueError(f"admission slot {slot!r}: need 0 <= i < n")
    return (i, n)
