"""The parts of the vLLM backend that need no engine: the asyncio bridge, the backend's config, the engine's choice,
and the rollout's `VllmEngine` around a stand-in sampler."""

import asyncio

import pytest
import torch
import trio
import trio.testing

from actors.cli import load_config
from actors.runs.config import built_args
from actors.rollout.actor import RolloutConfig, start_engine
from actors.rollout.hf_engine import HfEngine, HfSampler, SnapshotCache
from actors.rollout.sampling import Sample
from actors.rollout.serving import Served
from actors.rollout.vllm_engine import (AsyncioThread, RequestRefused, VllmEngine, VllmOptions, engine_options)
from actors.rollout.weights import HeldWeights
from streams.messages import GenerationRequest
from streams.weights import FetchedWeights


@pytest.fixture
def bridge():
    thread = AsyncioThread("test-asyncio")
    yield thread
    thread.close()


def test_a_trio_task_awaits_a_coroutine_on_the_asyncio_thread(bridge):
    async def on_asyncio(x):
        await asyncio.sleep(0)
        return x * 2, asyncio.get_running_loop() is bridge.loop

    assert trio.run(lambda: bridge.run(on_asyncio(21))) == (42, True)


def test_cancelling_the_trio_task_cancels_the_coroutine(bridge):
    seen = {}

    async def forever(started: asyncio.Event):
        try:
            started.set()
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen["cancelled"] = True
            raise

    async def main():
        started = asyncio.Event()
        with trio.move_on_after(30) as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(bridge.run, forever(started))
                await bridge.run(started.wait())  # progress: the coroutine runs
                nursery.cancel_scope.cancel()
        assert not scope.cancelled_caught

    trio.run(main)
    bridge.call(asyncio.sleep(0))  # the loop has run the cancellation
    assert seen == {"cancelled": True}


def test_an_error_on_the_asyncio_side_reaches_the_trio_task(bridge):
    async def fails():
        raise KeyError("engine")

    with pytest.raises(KeyError, match="engine"):
        trio.run(lambda: bridge.run(fails()))


def test_the_backend_is_chosen_in_the_rollout_config():
    cfg = load_config(["rollout.backend=vllm", "rollout.args.vllm.kv_cache_gib=2"])
    rollout = RolloutConfig(model_path="m", backend=cfg.rollout.backend, **built_args(cfg.rollout.args))
    assert rollout.backend == "vllm" and rollout.vllm == VllmOptions(kv_cache_gib=2)
    assert load_config([]).rollout.backend == "hf"
    with pytest.raises(ValueError, match="unknown rollout backend 'sglang'"):
        RolloutConfig(model_path="m", backend="sglang")
    with pytest.raises(ValueError, match="latency_s must be >= 0"):
        RolloutConfig(model_path="m", latency_s=-1)
    with pytest.raises(ValueError, match="latency_s is emulated by the hf backend only"):
        RolloutConfig(model_path="m", backend="vllm", latency_s=0.1)


@pytest.mark.parametrize("options, message", [
    (dict(tensor_parallel_size=0), r"vllm\.tensor_parallel_size must be an integer >= 1, not 0"),
    (dict(max_num_seqs=0), r"vllm\.max_num_seqs must be an integer >= 1, not 0"),
    (dict(gpu_memory_utilization=1.2), r"vllm\.gpu_memory_utilization must be in \(0, 1\], not 1\.2"),
    (dict(kv_cache_gib=0), r"vllm\.kv_cache_gib must be > 0 \(or null\), not 0"),
    (dict(dtype="fp8"), r"vllm\.dtype: unknown dtype 'fp8'"),
])
def test_bad_vllm_options_fail_naming_the_key(options, message):
    with pytest.raises(ValueError, match=message):
        VllmOptions(**options)


def test_vllm_engine_options_on_the_cpu_keep_todays_engine():
    args = engine_options(VllmOptions(), on_cpu=True)
    assert args["dtype"] == "float32" and args["kv_cache_memory_bytes"] == 2**30
    assert args["distributed_executor_backend"] == "uni" and args["tensor_parallel_size"] == 1
    assert args["enable_prefix_caching"] is None  # vLLM's default
    assert engine_options(VllmOptions(kv_cache_gib=0.5, dtype="bf16"), on_cpu=True)["kv_cache_memory_bytes"] == 2**29
    several = engine_options(VllmOptions(tensor_parallel_size=2), on_cpu=True)  # vLLM's CPU build can
    assert several["distributed_executor_backend"] == "mp" and several["tensor_parallel_size"] == 2


def test_vllm_engine_options_on_gpus_leave_the_kv_cache_to_the_memory_share():
    args = engine_options(VllmOptions(gpu_memory_utilization=0.6, enable_prefix_caching=True), on_cpu=False)
    assert args["dtype"] == "bfloat16" and args["kv_cache_memory_bytes"] is None
    assert args["gpu_memory_utilization"] == 0.6 and args["enable_prefix_caching"] is True
    several = engine_options(VllmOptions(tensor_parallel_size=4, kv_cache_gib=8, dtype="float16"), on_cpu=False)
    assert several["distributed_executor_backend"] == "mp" and several["tensor_parallel_size"] == 4
    assert several["kv_cache_memory_bytes"] == 8 * 2**30 and several["dtype"] == "float16"


def test_a_null_memory_share_on_a_gpu_takes_what_is_free_less_room_for_the_snapshots(monkeypatch):
    """0.9 of the whole GPU (the old default) left nothing for a learner already on it or for the league
    snapshots the same actor's hf sampler loads later: a null share is 0.9 of what is free when the engine starts,
    less the snapshots' room, as a share of the whole GPU (what vLLM's setting means)."""
    from actors.rollout.vllm_engine import gpu_share

    gib = 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *device: (40 * gib, 80 * gib))  # a learner holds half
    assert engine_options(VllmOptions(), on_cpu=False, reserve_bytes=8 * gib)["gpu_memory_utilization"] == \
        pytest.approx(0.9 * 32 / 80)
    assert engine_options(VllmOptions(), on_cpu=False)["gpu_memory_utilization"] == pytest.approx(0.45)
    assert engine_options(VllmOptions(gpu_memory_utilization=0.7), on_cpu=False)["gpu_memory_utilization"] == 0.7
    with pytest.raises(RuntimeError, match=r"2\.0 GiB of the GPU's 80\.0 GiB are free, 1\.0 GiB of them kept for "
                                           r"league snapshots .*set rollout\.args\.vllm\.gpu_memory_utilization"):
        gpu_share(2 * gib, 80 * gib, reserve_bytes=gib)


def test_the_snapshot_room_counts_the_models_stored_parameters(tiny_model_dir):
    from actors.models.base_model import load_policy, stored_parameters

    assert stored_parameters(tiny_model_dir) == sum(p.numel() for p in load_policy(tiny_model_dir)[0].parameters())


class FakeVllm:
    """`VllmSampler`'s stand-in: one token a request, tagged with the version it holds; refuses a temperature over
    2 as vLLM would; records what it loaded."""

    name = "rollout-f"

    def __init__(self):
        self.version, self.loads, self.stats, self.closed = 0, [], {"weight_loads": 0}, False

    async def load(self, version: int, data) -> None:
        self.loads.append(version)
        self.version = version
        self.stats["weight_loads"] += 1

    async def sample(self, prompt, *, temperature: float, max_tokens: int) -> Sample:
        if temperature > 2:
            raise RequestRefused(f"temperature {temperature} is over 2")
        return Sample([len(prompt)], [-0.5], [self.version], False)

    def close(self) -> None:
        self.closed = True


def test_the_vllm_engine_loads_arrivals_and_answers_each_request_once_its_weights_are_in():
    """A live request waits until the engine holds its ``min_version`` (loaded as it arrives), one the engine
    refuses is answered with the reason, and one for a snapshot goes past the engine to the hf side (here refused:
    the actor has no snapshot_dir)."""
    weights, vllm = HeldWeights("main", "rollout-f"), FakeVllm()
    hf = HfSampler(None, torch.device("cpu"), torch.float32, 0, Served())
    engine = VllmEngine(vllm, SnapshotCache(hf, "main", None, 2, "rollout-f"), weights, max_batch=4)
    answers = {}

    async def main():
        requests_in, requests = trio.open_memory_channel(8)
        completions, completions_out = trio.open_memory_channel(8)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(engine.serve, requests, completions)
            await requests_in.send(GenerationRequest(1, "inproc://env", "main", [5, 6, 7], 1.0, 4, 1))
            await trio.testing.wait_all_tasks_blocked()
            assert completions_out.statistics().current_buffer_used == 0 and vllm.loads == []
            weights.offer(FetchedWeights(1, bytearray(b"weights of 1")))
            for request in (GenerationRequest(2, "inproc://env", "main", [5], 5.0, 4, 0),
                            GenerationRequest(3, "inproc://env", "main-v3", [5], 1.0, 4, 0)):
                await requests_in.send(request)
            for _ in range(3):
                completion, request = await completions_out.receive()
                answers[request.request_id] = completion
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert vllm.loads == [1] and (answers[1].token_ids, answers[1].versions, answers[1].error) == ([3], [1], "")
    assert "temperature 5.0 is over 2" in answers[2].error and not answers[2].token_ids
    assert "not 'main-v3'" in answers[3].error
    stats = engine.statistics()
    assert (stats["requests"], stats["tokens"], stats["refused_requests"], stats["unknown_policy"]) == (1, 1, 1, 1)
    assert stats["vllm"] == {"weight_loads": 1} and weights.statistics()["version_waits"] == 1


def test_the_backend_chooses_the_engine_once_with_the_rollouts_settings(tiny_model_dir, monkeypatch):
    """``start_engine``: hf makes an `HfEngine`; vllm a `VllmEngine` whose sampler gets the rollout's dtype (its own
    vllm.dtype being null), batch size, seed and name, and whose snapshots go to an hf sampler on the device."""
    from actors.rollout import actor

    made = {}

    class Recording(FakeVllm):
        def __init__(self, model_path, eos_id, **kwargs):
            super().__init__()
            made.update(kwargs, model_path=model_path)

    monkeypatch.setattr(actor, "VllmSampler", Recording)
    cfg = dict(model_path=str(tiny_model_dir), max_batch=7, seed=3, dtype="bfloat16", device="cpu")
    weights = HeldWeights("main", "rollout-2")
    assert isinstance(start_engine(RolloutConfig(**cfg), weights, "rollout-2"), HfEngine)
    engine = start_engine(RolloutConfig(**cfg, backend="vllm"), weights, "rollout-2")
    assert isinstance(engine, VllmEngine) and isinstance(engine.sampler, Recording)
    assert made["options"].dtype == "bfloat16" and (made["max_seqs"], made["seed"], made["name"]) == (7, 3, "rollout-2")
    assert made["model_path"] == str(tiny_model_dir) and len(engine.tokenizer) > 0
    assert (engine.snapshots.sampler.device, engine.snapshots.sampler.dtype) == (torch.device("cpu"), torch.bfloat16)
