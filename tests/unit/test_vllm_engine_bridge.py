"""The parts of the vLLM backend that need no engine: the asyncio bridge and the backend's config."""

import asyncio

import pytest
import trio

from actors.cli import load_config
from actors.config import built_args
from actors.rollout import RolloutConfig
from actors.engines.vllm_engine import AsyncioThread, VllmOptions


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
