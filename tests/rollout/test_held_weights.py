"""The rollout's weights (`HeldWeights`) within one learner life: the newest weights offered are the ones loaded,
a waiter that loads counts each wait for the learner, a request waiting on the engine's loader counts one, and a
swap between two decoding steps loads what arrived and nothing else."""

import torch
import trio
import trio.testing

from actors.rollout.weights import HeldWeights
from streams.weights import FetchedWeights, load_weights, weights_to_bytes


def version_of(value: float) -> FetchedWeights:
    """Weights of version ``value`` (no life: a learner that does not say), a 2x2 layer filled with it."""
    layer = torch.nn.Linear(2, 2, bias=False)
    torch.nn.init.constant_(layer.weight, value)
    return FetchedWeights(int(value), bytearray(weights_to_bytes(layer)))


class Layer:
    """An engine's stand-in: a layer its ``load`` copies weights into (on the trio loop, so that
    ``wait_all_tasks_blocked`` sees a load through), and what it loaded."""

    def __init__(self):
        self.model, self.loaded = torch.nn.Linear(2, 2, bias=False), []

    async def load(self, version: int, tensors) -> None:
        load_weights(self.model, tensors)
        self.loaded.append(version)


def test_a_waiter_that_loads_takes_the_newest_offered_and_counts_each_wait_for_the_learner():
    weights, layer = HeldWeights("main", "rollout-t"), Layer()

    async def main():
        weights.offer(version_of(1))
        weights.offer(version_of(2))  # replaces 1, never loaded
        weights.offer(version_of(1))  # older than what waits: not kept
        await weights.wait_for(2, layer.load)
        assert layer.loaded == [2] and weights.statistics()["version_waits"] == 0
        async with trio.open_nursery() as nursery:
            nursery.start_soon(weights.wait_for, 4, layer.load)
            await trio.testing.wait_all_tasks_blocked()
            weights.offer(version_of(3))  # loaded, still older than asked: a second wait
            await trio.testing.wait_all_tasks_blocked()
            assert layer.loaded == [2, 3] and weights.statistics()["version_waits"] == 2
            weights.offer(version_of(4))
        assert layer.loaded == [2, 3, 4] and float(layer.model.weight.detach()[0, 0]) == 4.0

    trio.run(main)
    assert weights.statistics() == {"weights_applied": 3, "weights_applied_mid_batch": 0, "version_waits": 2,
                                    "lives_followed": 0, "version_timeouts": 0, "version": 4, "life": None,
                                    "learner_life": None, "announced": None}


def test_a_request_waiting_for_the_loader_counts_one_wait_however_many_loads_it_waits_through():
    weights, layer = HeldWeights("main", "rollout-v"), Layer()
    answered = []

    async def request(min_version: int):
        await weights.wait_for(min_version)
        answered.append(weights.version)

    async def main():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(weights.load_arrivals, layer.load)
            nursery.start_soon(request, 3)
            for version in (1, 2, 3):
                weights.offer(version_of(version))
                await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert layer.loaded == [1, 2, 3] and answered == [3]
    assert weights.statistics()["version_waits"] == 1 and weights.statistics()["weights_applied"] == 3


def test_a_swap_between_two_decoding_steps_loads_what_arrived_and_nothing_otherwise():
    weights, layer = HeldWeights("main", "rollout-t"), Layer()

    async def main():
        assert await trio.to_thread.run_sync(weights.swap, layer.load) is None  # nothing arrived: the batch goes on
        weights.offer(version_of(5))
        assert await trio.to_thread.run_sync(weights.swap, layer.load) == 5
        assert await trio.to_thread.run_sync(weights.swap, layer.load) is None

    trio.run(main)
    assert layer.loaded == [5] and float(layer.model.weight.detach()[0, 0]) == 5.0
    stats = weights.statistics()
    assert (stats["weights_applied"], stats["weights_applied_mid_batch"], stats["version_waits"]) == (1, 1, 0)
