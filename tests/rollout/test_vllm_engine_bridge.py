"""The parts of the vLLM backend that need no engine: the asyncio bridge and the backend's config."""

import asyncio

import pytest
import trio

from actors.cli import load_config
from actors.runs.config import built_args
from actors.rollout.actor import RolloutConfig
from actors.rollout.vllm_engine import AsyncioThread, VllmOptions, engine_options


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
