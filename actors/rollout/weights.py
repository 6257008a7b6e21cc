"""The rollout actor's weights: following its learner's versions and lives, and handing them to the engine.

The learner announces its version and its *life* (its starts in this life of the run) before each manifest, which
names that life too (`streams.weights.LearnerFeed`): a manifest of a newer life announces it. The actor holds
weights of one (life, version): it takes a newer version of the life it holds, and any version of a newer life,
even a lower one (a learner restarted from an older checkpoint).
Once a newer life is announced, the weights of the dead one are not sampled any more: a request waits for the
new life's weights, and so does a batch under way (``hf``, between two decoding steps), so no token is sampled
with the dead learner's weights after its successor announced itself. (``vllm``: requests in flight go on until
the new life's weights are loaded, which aborts and resumes them; a new request waits.)

The base model's weights the actor starts with (version 0, life None) are ordered by version alone, and no
life's announcement makes them dead.

A request waits for the weights its ``min_version`` asks for on its own, never holding up another's, and for at
most ``wait_s`` (then it is refused, counted in ``version_timeouts``); one that asks for more than the newest
version announced (``announced``, any life's) plus `streams.values.MIN_VERSION_SLACK` is refused at once.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

from streams.messages import VersionAnnounced
from streams.values import version_beyond
from streams.weights import FetchedWeights, LearnerFeed

log = logging.getLogger(__name__)
WAIT_LOG_S = 30.0  # a wait for weights says so this often
VERSION_WAIT_S = 300.0  # the longest a request waits for the weights its min_version asks for (then refused)

Load = Callable[[int, object], Awaitable[None]]  # an engine's load(version, tensors): the weights into the engine


class HeldWeights:
    """The weights a rollout actor's engine holds (``version``, ``life``), the newest checked weights that arrived
    and are not loaded yet, and the learner's newest life (``learner_life``).

    Everything here runs on the actor's trio loop; `swap` is called from the engine's sampling thread and does its
    work on the loop. The engine's ``load`` is handed in where the engine takes weights: a waiter that owns an idle
    engine loads them itself (`wait_for` with ``load``: hf between batches; `swap`: hf between two decoding steps),
    or a task of the engine loads each as it arrives (`load_arrivals`: vllm)."""

    def __init__(self, policy_id: str, name: str, wait_s: float = VERSION_WAIT_S):
        self.policy_id, self.name, self.wait_s = policy_id, name, wait_s
        self.version, self.life = 0, None  # of the weights the engine holds
        self.learner_life: int | None = None  # the newest life announced
        self.announced: int | None = None  # the highest version announced, in any life (None: nothing heard yet)
        self._newest: FetchedWeights | None = None  # checked, not yet loaded
        self._changed = trio.Event()  # set (and replaced) when weights arrive or load, or a life is announced
        self._stats = {"weights_applied": 0, "weights_applied_mid_batch": 0, "version_waits": 0, "lives_followed": 0,
                       "version_timeouts": 0}

    @property
    def live(self) -> bool:
        """Are the weights held the live life's (no newer life has been announced since they were published)?"""
        return self.learner_life is None or self.life is None or self.life == self.learner_life

    async def follow(self, feed: LearnerFeed, follower) -> None:
        """Follow the learner on ``feed`` until cancelled: its lives, and each manifest's weights that would
        replace those held, fetched by ``follower`` (`streams.weights.WeightsFollower`: from shared memory, or in
        checked chunks) and offered."""
        while True:
            message = await feed.receive()
            if message.policy_id != self.policy_id:
                continue
            self.announced = max(message.version, self.announced if self.announced is not None else -1)
            # a newer life's manifest announces it too (its announcement may have been missed)
            self.on_life_announced(message.life)
            if isinstance(message, VersionAnnounced) or not self._wanted(message.life, message.version):
                continue
            data = await follower.fetch(message)
            if data is not None:
                self.offer(FetchedWeights(message.version, data, message.life))

    def on_life_announced(self, life: int) -> None:
        """The learner announced ``life``: a newer one makes the weights held (and any not yet loaded) dead."""
        if self.learner_life is not None and life <= self.learner_life:
            return
        self.learner_life = life
        if self._newest is not None and self._newest.life != life:  # a dead life's weights are never loaded
            self._newest = None
        if not self.live:
            self._stats["lives_followed"] += 1
            log.warning("%s: the learner started again (life %d); the weights of its life %d (version %d) are not "
                        "sampled any more", self.name, life, self.life, self.version)
        self._wake()

    def offer(self, weights: FetchedWeights) -> None:
        """Checked weights for the engine: kept as the newest to load if they would replace those held (the live
        life's, newer than those held and than any kept); the waiters look again either way."""
        if self._wanted(weights.life, weights.version):
            self._newest = weights
        self._wake()

    async def wait_for(self, needed: int, load: Load | None = None) -> None:
        """Until the engine holds weights of version ``needed`` or newer, of the live life (saying so every
        ``WAIT_LOG_S``). With ``load``, the waiter loads what arrives itself (its engine is idle meanwhile), and
        each time nothing has arrived it counts a wait; without, another task loads (`load_arrivals`), and the
        waiter counts one wait however many loads it waits through."""
        counted = False
        while True:
            if load is not None:
                await self._load_newest(load)
            if self.version >= needed and self.live:
                return
            if load is None or self._newest is None:  # nothing arrived that this waiter could load
                if load is not None or not counted:
                    self._stats["version_waits"] += 1
                    counted = True
                await self._next_change(needed)

    def deadline(self) -> float:
        """When a request that begins to wait now must wait no longer (trio's clock)."""
        return trio.current_time() + self.wait_s

    def refusal(self, min_version: int, deadline: float) -> str:
        """Why a request for ``min_version`` waiting until ``deadline`` (`deadline`) must wait no longer: its
        version is beyond what was announced, or its wait is over (counted); "" while it may wait on."""
        if beyond := version_beyond(min_version, self.announced):
            return beyond
        if trio.current_time() < deadline:
            return ""
        self._stats["version_timeouts"] += 1
        return (f"waited {self.wait_s:g} s for weights of version {min_version} (holding {self.version}, "
                f"{self.announced} announced)")

    @property
    def pending(self) -> bool:
        """Have weights arrived that were not loaded yet?"""
        return self._newest is not None

    def next_change(self) -> trio.Event:
        """Set when weights next arrive or load, or a life is announced (taken before a look at what is held, so
        that nothing that happens after the look is missed)."""
        return self._changed

    def waited(self, requests: int) -> None:
        """``requests`` began to wait for newer weights than those held (counted in ``version_waits``)."""
        self._stats["version_waits"] += requests

    def swap(self, load: Load) -> int | None:
        """In a sampling thread (one that trio started), between two decoding steps: load the newest weights that
        arrived, if any, and return their version. If those held are a dead life's, first wait for the live life's
        (`wait_for`), so the batch samples no further token with them."""
        if self.live and self._newest is None:  # read off the loop: what arrives meanwhile waits for the next step
            return None
        return trio.from_thread.run(self._swap, load)

    async def load_arrivals(self, load: Load) -> None:
        """Load the newest weights as soon as they arrive, until cancelled (an engine that loads beside the
        requests it serves: vllm's)."""
        while True:
            if not await self._load_newest(load):
                await self._changed.wait()

    def statistics(self) -> dict:
        return {**self._stats, "version": self.version, "life": self.life, "learner_life": self.learner_life,
                "announced": self.announced}

    def _replaces(self, life: int | None, version: int) -> bool:
        """Would weights of (``life``, ``version``) replace those held? Another life's (a newer one: only the
        live life's are kept), or a newer version."""
        return (life is not None and self.life is not None and life != self.life) or version > self.version

    def _wanted(self, life: int | None, version: int) -> bool:
        """Are weights of (``life``, ``version``) worth fetching and keeping: the live life's, replacing those held,
        and newer than those kept?"""
        newest = self._newest
        if newest is not None and newest.life == life and version <= newest.version:
            return False
        return life == self.learner_life and self._replaces(life, version)

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _next_change(self, needed: int) -> None:
        """Until weights arrive or load, or a life is announced; a wait of ``WAIT_LOG_S`` says so and goes on."""
        changed = self._changed
        with trio.move_on_after(WAIT_LOG_S) as waited:
            await changed.wait()
        if waited.cancelled_caught:
            log.warning("%s: still waiting for weights of version %d of life %s (holding %d of life %s)", self.name,
                        needed, self.learner_life, self.version, self.life)

    async def _load_newest(self, load: Load) -> bool:
        """Load the newest weights that arrived, if they replace those held (and are the live life's)."""
        weights, self._newest = self._newest, None
        if weights is None or weights.life != self.learner_life or not self._replaces(weights.life, weights.version):
            return False
        await load(weights.version, weights.tensors)
        self.version, self.life = weights.version, weights.life
        self._stats["weights_applied"] += 1
        self._wake()
        return True

    async def _swap(self, load: Load) -> int | None:
        applied = self._stats["weights_applied"]
        await self.wait_for(0, load)  # what arrived; if those held are a dead life's, the live life's, waited for
        if self._stats["weights_applied"] == applied:
            return None
        self._stats["weights_applied_mid_batch"] += 1
        return self.version
