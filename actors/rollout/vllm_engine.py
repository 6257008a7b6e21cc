"""The ``vllm`` engine: vLLM's async engine as a trio-facing sampler (per-token log-probs and versions, weights
loaded in place), and the rollout actor's engine around it (`VllmEngine`).

vLLM's ``AsyncLLM`` lives on an asyncio loop in a thread of its own (`AsyncioThread`); trio tasks hand it
coroutines and wait for them without holding a thread each. The engine's scheduler and the worker that holds
the model run in processes vLLM spawns (so a script that starts one needs a ``__main__`` guard). Concurrent
requests are batched by vLLM's scheduler (continuous batching).

Log-probs: the engine runs in the rollout's dtype (``auto``: float32 on the CPU, the learner's there, bfloat16 on
a GPU) and reports the log-prob of each sampled token after temperature scaling
(``logprobs_mode="processed_logprobs"``), the quantity the learner recomputes.

Weights (`VllmSampler.load`): no new request enters the engine while weights change. Once every submission
under way has reached the engine, it is paused with every request in flight aborted, the worker reloads its
weights in place (vLLM's ``reload_weights``; the engine is not restarted), and the engine resumes. With one
worker (``tensor_parallel_size`` 1, the "uni" executor: the worker lives in the engine's own process) the
version's bytes go to it over the engine's RPC, in pieces sent while requests in flight go on, and loaded from
memory (`actors/rollout/vllm_worker.py`); with several workers (vLLM's "mp" executor, which would pass every
worker a copy) they are written once to a file that every worker maps, in a directory of the sampler's own under
``weights_dir`` (mode 0700, the file 0600; a killed rollout's directory is swept by the next sampler:
``streams/private_files.py``) (``weights_in_memory`` overrides the choice). An aborted request goes on from its prefix: its prompt and the tokens
it has so far are submitted again as the prompt of a new request, with the rest of its token budget. Each
submission is sampled by exactly one version, so every token is tagged with the version that sampled it.

Stop strings (``stop``, `StopStrings`): vLLM checks them in the text it detokenizes (``detokenize`` is on only
when there are stop strings: vLLM refuses them without it), keeps each in the output
(``include_stop_str_in_output``) and ends the request at the token that completes it, as the hf sampler does. It
checks only a submission's own output, not its prompt: after a resumed submission the sampler checks the tokens
where the two parts meet (a stop string across them ends the completion there, the tokens after it dropped).
``finished`` comes from vLLM's ``finish_reason``: ``stop`` (EOS or a stop string) is finished, ``length`` (the
token budget, or the model's length) is not.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import trio

from actors.models.devices import check_dtype, resolve_dtype
from actors.rollout.hf_engine import SnapshotCache
from actors.rollout.sampling import Sample, StopStrings
from actors.rollout.serving import waiting
from actors.rollout.weights import HeldWeights
from streams.messages import Completion, GenerationRequest
from streams.private_files import private_dir, remove_private_dir, sweep_stale, write_private

log = logging.getLogger(__name__)

MAX_TEMPERATURE = 2.0  # vLLM's SamplingParams refuses higher temperatures
PIECE_BYTES = 256 * 2**20  # weights sent in memory go in pieces of this size (msgpack carries < 4 GiB a value)


class RequestRefused(ValueError):
    """The engine will not sample this request (its settings are outside what vLLM accepts)."""


@dataclass
class VllmOptions:
    dtype: str | None = None  # null: the rollout's dtype (auto: bfloat16 on a GPU, float32 on the CPU)
    kv_cache_gib: float | None = None  # the KV cache's memory; null: gpu_memory_utilization sizes it (CPU: 1 GiB)
    # share of the GPU's memory for the engine (weights, activations, KV cache); null: 0.9 of what is free when it
    # starts, less room for the league snapshots the same actor's hf sampler may hold (`gpu_share`)
    gpu_memory_utilization: float | None = None
    tensor_parallel_size: int = 1  # workers (GPUs; on the CPU, processes) one engine spreads the model over
    max_num_seqs: int | None = None  # null: the rollout's max_batch
    enable_prefix_caching: bool | None = None  # null: vLLM's default
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    enforce_eager: bool = True  # no torch.compile or graph capture: a start of seconds, not minutes
    # how new weights reach the engine's workers: over its RPC (true) or through a file in weights_dir (false);
    # null: in memory with one worker, through the file with several (each maps it once, not a copy each)
    weights_in_memory: bool | None = None
    weights_dir: str | None = "/dev/shm"  # where the sampler's private directory for each version's file is made

    def __post_init__(self):
        if self.dtype is not None:
            try:
                check_dtype(self.dtype)
            except ValueError as error:
                raise ValueError(f"rollout.args.vllm.dtype: {error}") from None
        for key, low in (("tensor_parallel_size", 1), ("max_num_seqs", 1)):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, int) or value < low):
                raise ValueError(f"rollout.args.vllm.{key} must be an integer >= {low}, not {value!r}")
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("rollout.args.vllm.gpu_memory_utilization must be in (0, 1], "
                             f"not {self.gpu_memory_utilization!r}")
        if self.kv_cache_gib is not None and not self.kv_cache_gib > 0:
            raise ValueError(f"rollout.args.vllm.kv_cache_gib must be > 0 (or null), not {self.kv_cache_gib!r}")


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
    """One vLLM engine; `sample` is called from trio tasks, concurrently. ``version``: the weights it holds.
    ``stop``: the stop strings (`StopStrings`), or None."""

    def __init__(self, model_path: str, eos_id: int, *, options: VllmOptions | None = None, threads: int = 1,
                 max_seqs: int = 256, seed: int = 0, name: str = "rollout", stop: StopStrings | None = None,
                 reserve_bytes: int = 0):
        self.options = options or VllmOptions()
        self.eos_id, self.name, self.version, self.stop = eos_id, name, 0, stop
        self.stats = {"submissions": 0, "resumed": 0, "weight_loads": 0, "weight_loads_in_memory": 0,
                      "weight_loads_from_file": 0, "aborted_in_flight": 0, "stopped_across_resume": 0}
        self.in_memory = (self.options.tensor_parallel_size == 1 if self.options.weights_in_memory is None
                          else self.options.weights_in_memory)  # how `load` moves weights (module docstring)
        self._ids = itertools.count()
        self._weights_dir: Path | None = None  # made on the first load through a file
        self._submitting = 0  # submissions on their way into the engine
        self._loading = False
        self._changed = trio.Event()  # set (and replaced) whenever _submitting or _loading changes
        self._thread = AsyncioThread(f"{name}-vllm")
        self._engine = self._thread.call(self._start(model_path, threads, max_seqs, seed, reserve_bytes))

    async def _start(self, model_path: str, threads: int, max_seqs: int, seed: int, reserve_bytes: int):
        # One process for the scheduler and the model (the "uni" executor): each process vLLM spawns imports it
        # anew, which costs tens of seconds of a start on a small machine. OpenMP threads are not pinned to cores
        # that other actors share.
        env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
               "OMP_NUM_THREADS": str(threads), "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING")}
        with _environment(env):
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.platforms import current_platform
            from vllm.v1.engine.async_llm import AsyncLLM

            return AsyncLLM.from_engine_args(AsyncEngineArgs(
                model=model_path, seed=seed, max_num_seqs=self.options.max_num_seqs or max_seqs,
                logprobs_mode="processed_logprobs", disable_log_stats=True, use_tqdm_on_load=False,
                worker_extension_cls="actors.rollout.vllm_worker.WeightsFromMemory",
                **engine_options(self.options, on_cpu=current_platform.is_cpu(), reserve_bytes=reserve_bytes)))

    async def sample(self, prompt: list[int], *, temperature: float, max_tokens: int) -> Sample:
        """A continuation of ``prompt``, resumed from its prefix whenever new weights interrupt it."""
        if not prompt:
            raise ValueError("empty prompt: every prompt needs at least one token")
        tokens, logprobs, versions = [], [], []
        reason = None
        while len(tokens) < max_tokens:
            version, collector = await self._submit(prompt + tokens, temperature, max_tokens - len(tokens))
            new_tokens, new_logprobs, reason = await self._thread.run(self._collect(collector))
            joined = len(tokens)
            tokens += new_tokens
            logprobs += new_logprobs
            versions += [version] * len(new_tokens)
            if joined and self.stop is not None:  # a stop string across the two submissions' tokens
                end = self.stop.first_across(tokens, joined)
                if end is not None:
                    del tokens[end:], logprobs[end:], versions[end:]
                    self.stats["stopped_across_resume"] += 1
                    reason = "stop"
            if reason != "abort":
                break
            self.stats["resumed"] += 1
        return Sample(tokens, logprobs, versions, reason == "stop")

    async def _submit(self, prompt: list[int], temperature: float, max_tokens: int):
        """Add a request to the engine, never while weights change; (the version that samples it, its outputs)."""
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        while self._loading:
            await self._changed.wait()
        stop = list(self.stop.strings) if self.stop is not None else []
        try:  # vLLM checks stop strings in the text it detokenizes, and refuses them without it
            params = SamplingParams(temperature=temperature, max_tokens=max_tokens, logprobs=0,
                                    detokenize=bool(stop), stop=stop, include_stop_str_in_output=True,
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

    async def load(self, version: int, data, *, in_memory: bool | None = None) -> None:
        """Load weights ``version`` (a safetensors buffer, checked) in place; requests in flight resume.
        ``in_memory``: over the engine's RPC (True) or through a file (False); None: ``self.in_memory``."""
        in_memory = self.in_memory if in_memory is None else in_memory
        self._loading = True
        self._notify()
        try:
            if in_memory:  # sent while the engine generates; loaded once it is paused
                view = memoryview(data).cast("B")
                for offset in range(0, len(view), PIECE_BYTES):
                    await self._thread.run(self._engine.collective_rpc(
                        "tidal_stage_weights", args=(version, offset, len(view), view[offset:offset + PIECE_BYTES])))
            else:
                await trio.to_thread.run_sync(self._write, data)
            while self._submitting:
                await self._changed.wait()
            in_flight = self._engine.get_num_unfinished_requests()
            if in_memory:
                await self._thread.run(self._reload("tidal_load_staged_weights", {"version": version}))
            else:
                await self._thread.run(self._reload("reload_weights", {"weights_path": str(self._weights_dir)}))
            self.version = version
            self.stats["weight_loads"] += 1
            self.stats["weight_loads_in_memory" if in_memory else "weight_loads_from_file"] += 1
            self.stats["aborted_in_flight"] += in_flight
        finally:
            self._loading = False
            self._notify()

    def _write(self, data) -> None:
        if self._weights_dir is None:
            root = self.options.weights_dir or tempfile.gettempdir()
            sweep_stale(root)
            self._weights_dir = private_dir(root, f"vllm-{self.name}")
        write_private(self._weights_dir, "model.safetensors", data)

    async def _reload(self, method: str, kwargs: dict) -> None:
        await self._engine.pause_generation(mode="abort", clear_cache=True)
        try:
            await self._engine.collective_rpc(method, kwargs=kwargs)
        finally:
            await self._engine.resume_generation()

    async def weight_checksums(self) -> list[dict[str, str]]:
        """A digest of every parameter the engine's workers hold (one dict a worker)."""
        return await self._thread.run(self._engine.compute_weight_checksums())

    def close(self) -> None:
        try:
            self._thread.cancel_all()  # the engine's output handler first: it would log the engine's end as a crash
            self._engine.shutdown()
            self._engine = None  # collected now, not at interpreter exit (where its __del__ fails)
        finally:
            self._thread.close()
            remove_private_dir(self._weights_dir)


class VllmEngine:
    """The ``vllm`` engine of a rollout actor: every request for the live policy a trio task of its own on the
    `VllmSampler`, up to ``max_batch`` in flight (vLLM batches them continuously), sampled once the engine holds
    weights as new as it asks for. Each new version is loaded into the running engine as soon as it arrives;
    requests in flight resume from their prefix with it. The engine holds one set of weights, the live policy's:
    requests for snapshots go past it to the hf sampler beside it (`SnapshotCache`), in batches of those waiting."""

    def __init__(self, sampler: VllmSampler, snapshots: SnapshotCache, weights: HeldWeights, *, max_batch: int):
        self.sampler, self.snapshots, self.weights, self.max_batch = sampler, snapshots, weights, max_batch
        self.tokenizer, self.served = snapshots.sampler.tokenizer, snapshots.sampler.served

    async def load(self, version: int, tensors) -> None:
        """Load weights into the running engine in place (`VllmSampler.load`)."""
        await self.sampler.load(version, tensors)

    async def serve(self, requests: trio.MemoryReceiveChannel, completions: trio.MemorySendChannel) -> None:
        snapshots_in, snapshots_out = trio.open_memory_channel(4 * self.max_batch)
        slots = trio.Semaphore(self.max_batch)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.weights.load_arrivals, self.load)
            nursery.start_soon(self._serve_snapshots, snapshots_out, completions)
            while True:
                idle_from = time.perf_counter()
                request = await requests.receive()
                if request.policy_id != self.weights.policy_id:
                    await snapshots_in.send(request)
                    continue
                if slots.value == self.max_batch:  # nothing was in flight while it waited
                    self.served.idle_s += time.perf_counter() - idle_from
                await slots.acquire()
                nursery.start_soon(self._answer, request, completions, slots)

    async def _serve_snapshots(self, requests: trio.MemoryReceiveChannel, completions) -> None:
        while True:
            await self.snapshots.sample(await waiting(requests, self.max_batch), completions)

    async def _answer(self, request: GenerationRequest, completions, slots: trio.Semaphore) -> None:
        try:
            deadline = self.weights.deadline()
            with trio.move_on_at(deadline) as waited:  # no request waits for ever, nor holds its slot
                await self.weights.wait_for(request.min_version)
            if waited.cancelled_caught:
                why = self.weights.refusal(request.min_version, deadline)
                await completions.send((Completion.refused(request.request_id, why), request))
                return
            try:
                s = await self.sampler.sample(request.prompt_ids, temperature=request.temperature,
                                              max_tokens=request.max_tokens)
            except ValueError as error:  # RequestRefused, an empty prompt: answer this request, serve the rest
                log.warning("%s: request %d refused by the engine: %s", self.sampler.name, request.request_id, error)
                self.served.refused_requests += 1
                await completions.send((Completion.refused(request.request_id, str(error)), request))
                return
            self.served.requests += 1
            self.served.tokens += len(s.tokens)
            await completions.send((Completion(request.request_id, s.tokens, s.logprobs, s.versions, s.finished),
                                    request))
        finally:
            slots.release()

    def statistics(self) -> dict:
        return {**asdict(self.served), **self.snapshots.statistics(), "vllm": dict(self.sampler.stats)}

    def close(self) -> None:
        self.sampler.close()


GPU_HEADROOM = 0.9  # a null gpu_memory_utilization takes this share of the memory free for the engine
MIN_GPU_SHARE = 0.05  # less than this of the GPU is too little for an engine: refused, naming the settings


def gpu_share(free_bytes: int, total_bytes: int, reserve_bytes: int = 0) -> float:
    """A null ``gpu_memory_utilization``: ``GPU_HEADROOM`` of the GPU's memory that is free when the engine starts
    (a learner or another engine on the same GPU has taken its own by then), less ``reserve_bytes`` kept for the
    league snapshots that the same actor's hf sampler loads later, as a share of the GPU's whole memory (what
    vLLM's setting means). 0.9 of the whole GPU, the old default, left nothing for either."""
    share = GPU_HEADROOM * (free_bytes - reserve_bytes) / total_bytes
    if share < MIN_GPU_SHARE:
        raise RuntimeError(
            f"rollout.args.vllm: {free_bytes / 2**30:.1f} GiB of the GPU's {total_bytes / 2**30:.1f} GiB are free, "
            f"{reserve_bytes / 2**30:.1f} GiB of them kept for league snapshots (rollout.args.max_snapshots): too "
            "little for the engine; set rollout.args.vllm.gpu_memory_utilization or kv_cache_gib, or keep fewer "
            "snapshots")
    return share


def engine_options(o: VllmOptions, *, on_cpu: bool, reserve_bytes: int = 0) -> dict:
    """The AsyncEngineArgs that ``o`` sets, for an engine on the CPU (vLLM's CPU build) or on GPUs (a null
    ``gpu_memory_utilization`` there: `gpu_share` of the current device, ``reserve_bytes`` kept)."""
    kv_cache_gib = 1 if o.kv_cache_gib is None and on_cpu else o.kv_cache_gib
    share = o.gpu_memory_utilization
    if share is None:  # with a KV cache size given, vLLM sizes nothing by the share
        share = GPU_HEADROOM if on_cpu or kv_cache_gib is not None else gpu_share(*torch.cuda.mem_get_info(),
                                                                                  reserve_bytes)
    dtype = resolve_dtype(o.dtype or "auto", torch.device("cpu" if on_cpu else "cuda"))
    return dict(
        dtype=str(dtype).removeprefix("torch."), max_model_len=o.max_model_len, enforce_eager=o.enforce_eager,
        # on a GPU a null kv_cache_gib leaves the KV cache to gpu_memory_utilization; on the CPU a size is given
        kv_cache_memory_bytes=None if kv_cache_gib is None else int(kv_cache_gib * 2**30),
        gpu_memory_utilization=share, enable_prefix_caching=o.enable_prefix_caching,
        tensor_parallel_size=o.tensor_parallel_size,
        # "uni" (the worker in the engine's process) serves one worker only; several need vLLM's "mp" executor
        distributed_executor_backend="uni" if o.tensor_parallel_size == 1 else "mp")
