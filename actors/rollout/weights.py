"""The rollout actor's weights: following its learner's versions and lives, and taking them into the engine.

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
"""

from __future__ import annotations

import logging

import trio

from streams.messages import VersionAnnounced
from streams.weights import FetchedWeights, LearnerFeed, load_weights

log = logging.getLogger(__name__)
WAIT_LOG_S = 30.0  # a wait for weights says so this often


class RolloutWeights:
    """A mixin of ``RolloutActor``: ``version`` and ``life`` are those of the weights the engine holds;
    ``_live_life`` the newest life announced; ``_latest_weights`` the newest checked weights not yet loaded."""

    version: int
    life: int | None
    _live_life: int | None

    def _replaces(self, life: int | None, version: int) -> bool:
        """Would weights of (``life``, ``version``) replace those held? Another life's (a newer one: only the
        live life's are kept), or a newer version."""
        return (life is not None and self.life is not None and life != self.life) or version > self.version

    def _held_dead(self) -> bool:
        """Are the weights held a dead life's (a newer life has been announced)?"""
        return self._live_life is not None and self.life is not None and self.life != self._live_life

    def _wanted(self, life: int | None, version: int) -> bool:
        pending = self._latest_weights
        if pending is not None and pending.life == life and version <= pending.version:
            return False
        return life == self._live_life and self._replaces(life, version)

    def _life_announced(self, life: int) -> None:
        if self._live_life is not None and life <= self._live_life:
            return
        self._live_life = life
        with self._weights_lock:  # a dead life's weights not yet loaded are never loaded
            if self._latest_weights is not None and self._latest_weights.life != life:
                self._latest_weights = None
        if self._held_dead():
            self._stats["lives_followed"] += 1
            log.warning("%s: the learner started again (life %d); the weights of its life %d (version %d) are not "
                        "sampled any more", self.name, life, self.life, self.version)
        self._wake()

    def _wake(self) -> None:
        self._weights_arrived.set()
        self._weights_arrived = trio.Event()

    async def _follow_weights(self, feed: LearnerFeed) -> None:
        while True:
            message = await feed.receive()
            if message.policy_id != self.cfg.policy_id:
                continue
            if isinstance(message, VersionAnnounced):
                self._life_announced(message.life)
                continue
            life = message.life
            self._life_announced(life)  # (a newer life's manifest announces it: its announcement may have been missed)
            if not self._wanted(life, message.version):
                continue
            data = await self._follower.fetch(message)  # from shared memory, or in chunks; checked
            if data is None:
                continue
            with self._weights_lock:  # (a newer life may have been announced meanwhile)
                if self._wanted(life, message.version):
                    self._latest_weights = FetchedWeights(message.version, data, life)
            self._wake()

    def _take(self) -> FetchedWeights | None:
        """The newest weights that arrived, if they replace those held (and are the live life's)."""
        with self._weights_lock:
            weights, self._latest_weights = self._latest_weights, None
        if weights is None or weights.life != self._live_life or not self._replaces(weights.life, weights.version):
            return None
        return weights

    def _take_weights(self, model) -> int | None:
        """Load the newest weights that arrived, if any (in the thread that owns the model); their version."""
        weights = self._take()
        if weights is None:
            return None
        load_weights(model, weights.tensors)
        self.version, self.life = weights.version, weights.life
        self._stats["weights_applied"] += 1
        return self.version

    async def _catch_up(self, model, needed: int) -> None:
        """Apply what arrived; then, while older than ``needed`` or holding a dead life's, wait for newer weights."""
        await trio.to_thread.run_sync(self._take_weights, model)
        while self.version < needed or self._held_dead():
            if self._latest_weights is None:
                self._stats["version_waits"] += 1
                await self._arrival(needed)
            await trio.to_thread.run_sync(self._take_weights, model)

    async def _arrival(self, needed: int) -> None:
        """Wait for weights to arrive (or a new life to be announced), saying so every ``WAIT_LOG_S``."""
        arrived = self._weights_arrived
        with trio.move_on_after(WAIT_LOG_S) as waited:
            await arrived.wait()
        if waited.cancelled_caught:
            log.warning("%s: still waiting for weights of version %d of life %s (holding %d of life %s)", self.name,
                        needed, self._live_life, self.version, self.life)

    async def _live_weights(self) -> None:
        """Wait until weights of the live life have arrived (the held ones are a dead life's)."""
        while self._held_dead() and self._latest_weights is None:
            await self._arrival(self.version)

    def _swap_mid_batch(self, model) -> int | None:
        """hf, between two decoding steps: newer weights if they arrived; if those held are a dead life's, the
        live life's first (waited for)."""
        if self._held_dead():
            trio.from_thread.run(self._live_weights)
        version = self._take_weights(model) if self._latest_weights is not None else None
        self._stats["weights_applied_mid_batch"] += version is not None
        return version

    async def _apply_weights(self, sampler) -> None:
        """vllm: load each version into the running engine as soon as it arrives."""
        while True:
            arrived = self._weights_arrived
            weights = self._take()
            if weights is None:
                await arrived.wait()
                continue
            await sampler.load(weights.version, weights.tensors)
            self.version, self.life = sampler.version, weights.life
            self._stats["weights_applied"] += 1
            changed, self._version_changed = self._version_changed, trio.Event()
            changed.set()

    async def _wait_for_version(self, needed: int) -> None:
        """vllm: wait until the engine holds ``needed`` or newer, of the live life."""
        if self.version < needed or self._held_dead():
            self._stats["version_waits"] += 1
        while self.version < needed or self._held_dead():
            changed = self._version_changed
            with trio.move_on_after(WAIT_LOG_S) as waited:
                await changed.wait()
            if waited.cancelled_caught:
                log.warning("%s: still waiting for weights of version %d of life %s (holding %d of life %s)",
                            self.name, needed, self._live_life, self.version, self.life)
