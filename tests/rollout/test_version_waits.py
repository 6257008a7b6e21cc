"""A request's ``min_version`` holds up that request only, and not for ever. The review's run: after one request
with ``min_version=10**12`` an hf rollout answered none of the next 3 honest ones in 15 s, for it waited for the
batch's newest ``min_version`` before sampling any of it, and every later batch queued behind."""

import torch
import trio
import trio.testing

from actors.rollout.hf_engine import HfEngine, HfSampler, SnapshotCache
from actors.rollout.serving import Served
from actors.rollout.weights import HeldWeights
from streams.messages import Completion, GenerationRequest
from streams.values import MIN_VERSION_SLACK, RequestChecks
from streams.weights import FetchedWeights, load_weights, weights_to_bytes

WAIT_S = 60.0


class ScriptedSampler:
    """The hf sampler's stand-in: every request answered with one token of the version it is sampled at."""

    counting = HfSampler.counting

    def __init__(self):
        self.tokenizer, self.served = None, Served()

    async def sample_pass(self, model, requests, version, swap=None):
        return [(Completion(r.request_id, [1], [-0.5], [version], True), r) for r in requests]


def version_of(value: int) -> FetchedWeights:
    layer = torch.nn.Linear(2, 2, bias=False)
    torch.nn.init.constant_(layer.weight, float(value))
    return FetchedWeights(value, bytearray(weights_to_bytes(layer)))


def request(request_id: int, min_version: int = 0) -> GenerationRequest:
    return GenerationRequest(request_id, "tcp://127.0.0.1:9", "main", [1, 2], 1.0, 2, min_version)


class LoopEngine(HfEngine):
    """The hf engine, loading weights on the trio loop (not in a thread, where the mock clock would jump past
    every deadline while the load runs)."""

    async def load(self, version: int, tensors) -> None:
        load_weights(self.model, tensors)


def engine(weights: HeldWeights) -> HfEngine:
    sampler = ScriptedSampler()
    return LoopEngine(torch.nn.Linear(2, 2, bias=False), sampler, SnapshotCache(sampler, "main", None, 1, "rollout-t"),
                      weights, max_batch=4)


def test_a_far_off_min_version_holds_up_only_its_own_request_and_is_refused_at_its_deadline():
    weights, answers = HeldWeights("main", "rollout-t", wait_s=WAIT_S), {}

    async def main():
        requests_in, requests_out = trio.open_memory_channel(16)
        completions_in, completions_out = trio.open_memory_channel(16)
        with trio.fail_after(10 * WAIT_S):  # a stuck engine fails the test rather than hang it
            await serve_and_ask(requests_in, requests_out, completions_in, completions_out)

    async def serve_and_ask(requests_in, requests_out, completions_in, completions_out):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(engine(weights).serve, requests_out, completions_in)

            async def answered(count: int):
                for _ in range(count):
                    completion, _ = await completions_out.receive()
                    answers[completion.request_id] = (completion, trio.current_time())

            for r in (request(1, 10**12), request(2), request(3, 2), request(4)):  # nothing announced yet
                await requests_in.send(r)
            await answered(2)
            assert sorted(answers) == [2, 4] and answers[2][1] == 0.0  # at once, at version 0
            weights.offer(version_of(2))  # version 2 arrives: request 3 goes, still before any deadline
            await answered(1)
            assert answers[3][0].versions == [2] and answers[3][1] < WAIT_S
            await requests_in.send(request(5))
            await answered(2)  # request 5 at once; 10**12 at its deadline
            assert answers[5][1] < WAIT_S <= answers[1][1]
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    refused = answers[1][0]
    assert not refused.token_ids and "waited 60 s for weights of version 1000000000000" in refused.error
    stats = weights.statistics()
    assert stats["version_timeouts"] == 1 and stats["version_waits"] == 2  # requests 1 and 3 waited


def test_a_min_version_beyond_the_newest_announced_is_refused_on_arrival_and_when_announced_later():
    weights, answers = HeldWeights("main", "rollout-t", wait_s=WAIT_S), {}
    checks = RequestChecks("rollout-t")
    weights.announced = 5
    assert checks.refusal(request(1, 5 + MIN_VERSION_SLACK), 100, weights.announced) == ""
    assert "beyond the newest version announced (5)" in checks.refusal(request(2, 6 + MIN_VERSION_SLACK), 100,
                                                                        weights.announced)
    assert checks.statistics()["rejected_by_reason"] == {"version": 1}
    weights.announced = None  # a request put aside before the first announcement ...

    async def main():
        requests_in, requests_out = trio.open_memory_channel(16)
        completions_in, completions_out = trio.open_memory_channel(16)
        with trio.fail_after(10 * WAIT_S):  # a stuck engine fails the test rather than hang it
            async with trio.open_nursery() as nursery:
                nursery.start_soon(engine(weights).serve, requests_out, completions_in)
                await requests_in.send(request(1, 10**12))
                await trio.testing.wait_all_tasks_blocked()
                weights.announced = 3  # ... is refused once one says how far off it is (`follow` does, then wakes)
                weights.on_life_announced(0)
                completion, _ = await completions_out.receive()
                answers[completion.request_id] = (completion, trio.current_time())
                nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert "beyond the newest version announced (3)" in answers[1][0].error and answers[1][1] < WAIT_S
    assert weights.statistics()["version_timeouts"] == 0
