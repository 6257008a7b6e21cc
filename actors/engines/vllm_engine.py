"""vLLM's async engine as a trio-facing sampler: per-token log-probs and versions, weights loaded in place.

vLLM's ``AsyncLLM`` lives on an asyncio loop in a thread of its own (`AsyncioThread`); trio tasks hand it
coroutines and wait for them without holding a thread each. The engine's scheduler and the worker that holds
the model run in processes vLLM spawns (so a script that starts one needs a ``__main__`` guard). Concurrent
requests are batched by vLLM's scheduler (continuous batching).

Log-probs: the engine runs in the learner's dtype (float32) and reports the log-prob of each sampled token
after temperature scaling (``logprobs_mode="processed_logprobs"``), the quantity the learner recomputes.

Weights (`VllmSampler.load`): no new request enters the engine while weights change. Once every submission
under way has reached the engine, it is paused with every request in flight aborted, the worker reloads its
weights in place from a safetensors file in a private directory (vLLM's ``reload_weights``; the engine is
not restarted), and the engine resumes. An aborted request goes on from its prefix: its prompt and the tokens
it has so far are submitted again as the prompt of a new request, with the rest of its token budget. Each
submission is sampled by exactly one version, so every token is tagged with the version that sampled it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import trio

from actors.engines.hf import Sample

log = logging.getLogger(__name__)


class RequestRefused(ValueError):
    """The engine will not sample this request (its settings are outside what vLLM accepts)."""


@dataclass
class VllmOptions:
    dtype: str = "float32"  # the learner's dtype: behaviour and learner log-probs then agree to rounding
    kv_cache_gib: int = 1  # the KV cache's memory (on CPU, of the host's)
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    enforce_eager: bool = True  # no torch.compile or graph capture: a start of seconds, not minutes
    weights_dir: str | None = "/dev/shm"  # where each new version is written for the worker to read


class AsyncioThread:
    """An asyncio loop in a daemon thread; trio tasks run coroutines on it with `run`."""

    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def call(self, coro):
        """Run ``coro`` on the loop and block until it ends (from a plain thread, not trio's)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    async def run(self, coro):
        """Run ``coro`` on the loop; the trio task waits without a thread. Cancelling it cancels ``coro``."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        token, done = trio.lowlevel.current_trio_token(), trio.Event()

        def wake(_):
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(done.set)

        future.add_done_callback(wake)
        try:
            await done.wait()
        except trio.Cancelled:
            future.cancel()
            raise
        return future.result()

    def cancel_all(self) -> None:
        """Cancel every task still running on the loop."""
        with contextlib.suppress(Exception):
            self.call(_cancel_all())

    def close(self) -> None:
        self.cancel_all()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()


async def _cancel_all() -> None:
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@contextlib.contextmanager
def _environment(values: dict[str, str]):
    """Set environment variables while vLLM spawns its processes (they inherit them), then restore them."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class VllmSampler:
    """One vLLM engine; `sample` is called from trio tasks, concurrently. ``version``: the weights it holds."""

    def __init__(self, model_path: str, eos_id: int, *, options: VllmOptions | None = None, threads: int = 1,
                 max_seqs: int = 256, seed: int = 0, name: str = "rollout"):
        self.options = options or VllmOptions()
        self.eos_id, self.name, self.version = eos_id, name, 0
        self.stats = {"submissions": 0, "resumed": 0, "weight_loads": 0, "aborted_in_flight": 0}
        self._ids = itertools.count()
        self._weights_dir = Path(tempfile.mkdtemp(prefix=f"tidal-vllm-{name}-", dir=self.options.weights_dir))
        self._submitting = 0  # submissions on their way into the engine
        self._loading = False
        self._changed = trio.Event()  # set (and replaced) whenever _submitting or _loading changes
        self._thread = AsyncioThread(f"{name}-vllm")
        self._engine = self._thread.call(self._start(model_path, threads, max_seqs, seed))

    async def _start(self, model_path: str, threads: int, max_seqs: int, seed: int):
        # One process for the scheduler and the model (the "uni" executor): each process vLLM spawns imports it
        # anew, which costs tens of seconds of a start on a small machine. OpenMP threads are not pinned to cores
        # that other actors share.
        env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
               "OMP_NUM_THREADS": str(threads), "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING")}
        with _environment(env):
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM

            o = self.options
            return AsyncLLM.from_engine_args(AsyncEngineArgs(
                model=model_path, dtype=o.dtype, seed=seed, max_model_len=o.max_model_len,
                max_num_seqs=max_seqs, kv_cache_memory_bytes=o.kv_cache_gib * 2**30, enforce_eager=o.enforce_eager,
                logprobs_mode="processed_logprobs", disable_log_stats=True, distributed_executor_backend="uni",
                use_tqdm_on_load=False))

    async def sample(self, prompt: list[int], *, temperature: float, max_tokens: int) -> Sample:
        """A continuation of ``prompt``, resumed from its prefix whenever new weights interrupt it."""
        if not prompt:
            raise ValueError("empty prompt: every prompt needs at least one token")
        tokens, logprobs, versions = [], [], []
        while len(tokens) < max_tokens and not (tokens and tokens[-1] == self.eos_id):
            version, collector = await self._submit(prompt + tokens, temperature, max_tokens - len(tokens))
            new_tokens, new_logprobs, reason = await self._thread.run(self._collect(collector))
            tokens += new_tokens
            logprobs += new_logprobs
            versions += [version] * len(new_tokens)
            if reason != "abort":
                break
            self.stats["resumed"] += 1
        return Sample(tokens, logprobs, versions, bool(tokens and tokens[-1] == self.eos_id))

    async def _submit(self, prompt: list[int], temperature: float, max_tokens: int):
        """Add a request to the engine, never while weights change; (the version that samples it, its outputs)."""
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        while self._loading:
            await self._changed.wait()
        try:
            params = SamplingParams(temperature=temperature, max_tokens=max_tokens, logprobs=0, detokenize=False,
                                    output_kind=RequestOutputKind.DELTA)
        except Exception as error:  # vLLM's VLLMValidationError: this request's settings, not the engine
            raise RequestRefused(str(error)) from error
        self._set_submitting(+1)
        try:
            request_id = f"{self.name}-{next(self._ids)}"
            collector = await self._thread.run(self._engine.add_request(
                request_id, TokensPrompt(prompt_token_ids=prompt), params))
        finally:
            self._set_submitting(-1)
        self.stats["submissions"] += 1
        return self.version, collector

    async def _collect(self, collector) -> tuple[list[int], list[float], str | None]:
        """On the asyncio loop: the request's tokens, their log-probs and why it ended."""
        tokens, logprobs = [], []
        try:
            while True:
                out = collector.get_nowait() or await collector.get()
                completion = out.outputs[0]
                tokens += completion.token_ids
                logprobs += [step[token].logprob for token, step in zip(completion.token_ids, completion.logprobs)]
                if out.finished:
                    return tokens, logprobs, completion.finish_reason
        except asyncio.CancelledError:
            await self._engine.abort(collector.request_id, internal=True)
            raise
        finally:
            collector.close()

    def _set_submitting(self, delta: int) -> None:
        self._submitting += delta
        self._notify()

    def _notify(self) -> None:
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    async def load(self, version: int, data) -> None:
        """Load weights ``version`` (a safetensors buffer, checked) in place; requests in flight resume."""
        self._loading = True
        self._notify()
        try:
            await trio.to_thread.run_sync(self._write, data)
            while self._submitting:
                await self._changed.wait()
            in_flight = self._engine.get_num_unfinished_requests()
            await self._thread.run(self._reload())
            self.version = version
            self.stats["weight_loads"] += 1
            self.stats["aborted_in_flight"] += in_flight
        finally:
            self._loading = False
            self._notify()

    def _write(self, data) -> None:
        partial = self._weights_dir / "model.safetensors.partial"
        partial.write_bytes(memoryview(data))
        partial.rename(self._weights_dir / "model.safetensors")

    async def _reload(self) -> None:
        await self._engine.pause_generation(mode="abort", clear_cache=True)
        try:
            await self._engine.collective_rpc("reload_weights", kwargs={"weights_path": str(self._weights_dir)})
        finally:
            await self._engine.resume_generation()

    def close(self) -> None:
        try:
            self._thread.cancel_all()  # the engine's output handler first: it would log the engine's end as a crash
            self._engine.shutdown()
            self._engine = None  # collected now, not at interpreter exit (where its __del__ fails)
        finally:
            self._thread.close()
            shutil.rmtree(self._weights_dir, ignore_errors=True)
