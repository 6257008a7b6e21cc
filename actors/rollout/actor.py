"""RolloutActor: owns a generation engine and a policy version; answers generation requests.

Two engines (``backend``), one interface and one output: tokens, the behaviour log-prob and the policy
version of every token, each completion sent to the address named in its request.

- ``hf``: requests from every env actor queue up; the actor takes as many as are waiting (up to
  ``max_batch``) and samples them in one batch in a worker thread (``actors/rollout/hf_engine.py``). New weights are
  applied between batches, or in the middle of one (interruptible generation).
- ``vllm``: every request is a trio task on vLLM's async engine (``actors/rollout/vllm_engine.py``), which batches
  them continuously, up to ``max_batch`` at once. New weights are loaded into the running engine as soon as
  they arrive; requests in flight resume from their prefix with them.

Either way a request waits until the actor holds weights at least as new as its ``min_version``, so no
token is older than the learner version its env actor acted on. A restarted learner is a new *life*: the actor
follows it even to a lower version, and samples nothing more with the dead life's weights once the new one
announced itself (`HeldWeights`, ``actors/rollout/weights.py``). A request it must not sample (a prompt token outside the
tokenizer's vocabulary, a negative ``min_version``: `streams.values.RequestChecks`) is refused on arrival.

In a league the actor also serves its member's frozen snapshots: a request whose ``policy_id`` is a snapshot id
``<policy_id>-v<n>`` is sampled with that snapshot's weights, loaded from ``snapshot_dir`` on first use (checked
against its checksums) and kept, up to ``max_snapshots`` of them, the least recently used out. Its tokens carry
the snapshot's version. One process serves the live policy and every snapshot; snapshots are sampled by the
``hf`` sampler with either backend (with ``vllm``, beside the engine, in batches of the snapshot requests that
are waiting: the engine holds one set of weights, the live policy's).

``device`` and ``dtype`` place the models the ``hf`` sampler runs (the live policy with ``hf``, and snapshots):
``auto`` is CUDA in bfloat16 when a GPU is visible, else the CPU in float32 (`actors/models/devices.py`). New
weights are copied into the model's parameters, so they take its device and dtype. The ``vllm`` engine runs on
its build's platform, in ``vllm.dtype`` (null: this ``dtype``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import torch
import trio

from actors.models.base_model import load_policy
from actors.models.devices import check_device, check_dtype, resolve_device, resolve_dtype
from streams.endpoints import Inbox
from actors.rollout.face import RolloutStatistics
from actors.rollout.hf_engine import device_generator, sample
from actors.models.snapshots import SnapshotError, load_snapshot, parse_snapshot_id
from actors.rollout.vllm_engine import VllmOptions
from actors.models.padding import cut
from actors.rollout.weights import HeldWeights, Load
from streams.weights import LearnerFeed, WeightsFollower, load_weights
from streams.messages import (VERSION_TOPIC, WEIGHTS_TOPIC, Completion, GenerationRequest, decode_requests,
                             encode_completions, split_completions)
from streams.replies import open_replies
from streams.values import RequestChecks
from streams.wire import Kind

log = logging.getLogger(__name__)


@dataclass
class RolloutConfig:
    model_path: str
    policy_id: str = "main"
    backend: str = "hf"  # hf | vllm
    max_batch: int = 256
    threads: int = 1
    interruptible: bool = True  # hf: apply new weights between decoding steps, not only between batches
    vllm: VllmOptions = field(default_factory=VllmOptions)  # a dict is accepted
    seed: int = 0
    snapshot_dir: str | None = None  # a league's snapshots (<policy_id>-v<n>/), served beside the live policy
    max_snapshots: int = 8  # snapshot models kept loaded
    # hf: seconds every batch takes on top of sampling, as on a remote or much larger engine: a latency-bound
    # task, on which more rollout actors mean more throughput (the scaling benchmark, autoscaling tests)
    latency_s: float = 0.0
    # false: take every version in checked chunks over ZeroMQ even from a learner on this host (as from one on
    # another machine), not from its shared-memory file
    weights_shared_memory: bool = True
    device: str = "auto"  # where hf models run: auto (CUDA when present) | cpu | cuda | cuda:<index>
    dtype: str = "auto"  # their precision: auto (bfloat16 on a GPU, float32 on the CPU) | float32 | bfloat16 | ...

    def __post_init__(self):
        for key, check in (("device", check_device), ("dtype", check_dtype)):
            try:
                check(getattr(self, key))
            except ValueError as error:
                raise ValueError(f"rollout.args.{key}: {error}") from None
        if not self.latency_s >= 0:
            raise ValueError(f"rollout latency_s must be >= 0 seconds, not {self.latency_s!r}")
        if self.latency_s and self.backend != "hf":
            raise ValueError(f"rollout latency_s is emulated by the hf backend only, not {self.backend!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown rollout backend {self.backend!r}; choose one of {', '.join(BACKENDS)}")
        if isinstance(self.vllm, dict):
            self.vllm = VllmOptions(**self.vllm)


BACKENDS = ("hf", "vllm")


class RolloutActor:
    def __init__(self, cfg: RolloutConfig, name: str = "rollout"):
        self.cfg, self.name = cfg, name
        self.weights = HeldWeights(cfg.policy_id, name)  # the learner's newest, and those the engine holds
        self._stats = {"requests": 0, "tokens": 0, "batches": 0, "generate_s": 0.0, "idle_s": 0.0,
                       "refused_requests": 0}
        self._started_at = time.perf_counter()
        self._queue = None
        self._follower = None
        self._streams: dict = {}
        self._inbox = None
        self._sampler = None
        self._snapshots: OrderedDict[str, tuple] = OrderedDict()  # snapshot id -> (model, version), LRU
        self._checks = RequestChecks(name)  # what a request must hold before it is queued
        self.device, self.dtype = torch.device("cpu"), torch.float32  # resolved when the actor loads its model

    async def run(self, transport, peers: dict, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        engine = await trio.to_thread.run_sync(self._load)  # hf: (model, tokenizer); vllm: (a VllmSampler, tokenizer)
        self._sampler = engine[0] if self.cfg.backend == "vllm" else None
        queue_in, queue_out = trio.open_memory_channel(4 * self.cfg.max_batch)
        completions_in, completions_out = trio.open_memory_channel(self.cfg.max_batch)
        self._queue = queue_out
        policy = self.cfg.policy_id.encode()
        try:
            async with (
                transport.open_receiver(capacity=1024) as requests,
                transport.open_subscriber(peers.get("weights", []), topics=[VERSION_TOPIC + policy,
                                                                            WEIGHTS_TOPIC + policy]) as weights,
                trio.open_nursery() as nursery,
            ):
                self._inbox = Inbox(requests, Kind.GENERATE, decode_requests)  # a batch of requests a frame
                manifests = LearnerFeed(weights)  # versions and lives, and manifests, in order
                self._follower = WeightsFollower(transport, shared_memory=self.cfg.weights_shared_memory)
                self._streams = {"requests": self._inbox, "weights": manifests}
                nursery.start_soon(self._queue_requests, queue_in, completions_in, len(engine[1]))
                nursery.start_soon(self.weights.follow, manifests, self._follower)
                nursery.start_soon(self._send_completions, completions_out, transport)
                if self.cfg.backend == "vllm":
                    snapshots_in, snapshots_out = trio.open_memory_channel(4 * self.cfg.max_batch)
                    nursery.start_soon(self.weights.load_arrivals, self._sampler.load)
                    nursery.start_soon(self._serve_streams, queue_out, self._sampler, completions_in, snapshots_in)
                    nursery.start_soon(self._serve_snapshots, snapshots_out, engine[1], completions_in)
                else:
                    nursery.start_soon(self._serve_batches, queue_out, *engine, completions_in)
                task_status.started({"requests": requests.address})
        finally:
            if self.cfg.backend == "vllm":
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(self._sampler.close)

    def _load(self):
        torch.set_num_threads(self.cfg.threads)
        try:
            self.device = resolve_device(self.cfg.device)
        except RuntimeError as error:
            raise RuntimeError(f"{self.name}: rollout.args.{error}") from None
        self.dtype = resolve_dtype(self.cfg.dtype, self.device)
        if self.cfg.backend == "vllm":
            from transformers import AutoTokenizer

            from actors.rollout.vllm_engine import VllmSampler

            tokenizer = AutoTokenizer.from_pretrained(self.cfg.model_path)
            options = dataclasses.replace(self.cfg.vllm, dtype=self.cfg.vllm.dtype or self.cfg.dtype)
            return VllmSampler(self.cfg.model_path, tokenizer.eos_token_id, options=options,
                               threads=self.cfg.threads, max_seqs=self.cfg.max_batch, seed=self.cfg.seed,
                               name=self.name), tokenizer
        return self._placed(load_policy(self.cfg.model_path))

    def _placed(self, loaded):
        """(model, tokenizer) with the model on the actor's device, in its dtype (no copy if it is there already)."""
        model, tokenizer = loaded
        return model.to(device=self.device, dtype=self.dtype), tokenizer

    async def _queue_requests(self, queue_in, completions, vocab_size: int) -> None:
        while True:
            for request in await self._inbox.receive():
                if refusal := self._checks.refusal(request, vocab_size):  # counted and logged; the env drops its episode
                    await completions.send((Completion.refused(request.request_id, refusal), request))
                else:
                    await queue_in.send(request)

    async def _send_completions(self, completions, transport) -> None:
        """Each to its request's ``reply_to``, if the transport may connect there; a destination that takes nothing
        holds up only its own replies, which are dropped after a deadline (`streams.replies`, counted). What is ready
        together goes together: one frame of completions per destination."""
        async with open_replies(transport, Kind.COMPLETION, self.name) as replies:
            self._streams["replies"] = replies
            while True:
                by_address: dict[str, list[Completion]] = {}
                for completion, request in await self._waiting(completions):
                    by_address.setdefault(request.reply_to, []).append(completion)
                for address, answers in by_address.items():
                    for batch in split_completions(answers):
                        replies.post(address, encode_completions(batch))

    async def _serve_batches(self, queue_out, model, tokenizer, completions) -> None:
        """hf: sample what is waiting in one batch, after catching up with the batch's newest min_version."""
        generator = device_generator(self.device, self.cfg.seed)
        while True:
            idle_from = time.perf_counter()
            batch = await self._waiting(queue_out)
            self._stats["idle_s"] += time.perf_counter() - idle_from
            if self.cfg.latency_s:
                await trio.sleep(self.cfg.latency_s)  # the emulated engine's latency: this batch is busy meanwhile
            live = [r for r in batch if r.policy_id == self.cfg.policy_id]
            if live:
                await self.weights.wait_for(max(request.min_version for request in live), loading_into(model))
                for answer in await self._generate(model, tokenizer, live, generator):
                    await completions.send(answer)
            await self._sample_snapshots([r for r in batch if r.policy_id != self.cfg.policy_id], tokenizer,
                                         generator, completions)

    async def _serve_snapshots(self, queue_out, tokenizer, completions) -> None:
        """vllm: the snapshot requests that are waiting, in one batch at a time, beside the engine."""
        generator = device_generator(self.device, self.cfg.seed)
        while True:
            await self._sample_snapshots(await self._waiting(queue_out), tokenizer, generator, completions)

    async def _waiting(self, queue_out) -> list:
        """What is waiting in ``queue_out`` (requests, or answers to send), up to ``max_batch`` (waits for the first)."""
        batch = [await queue_out.receive()]
        while len(batch) < self.cfg.max_batch:
            try:
                batch.append(queue_out.receive_nowait())
            except trio.WouldBlock:
                break
        return batch

    async def _sample_snapshots(self, requests: list[GenerationRequest], tokenizer, generator, completions) -> None:
        for policy, group in self._by_snapshot(requests):
            snapshot, refusal = await self._snapshot(policy)
            if snapshot is None:  # each request is answered with the reason; its env drops that episode
                for request in group:
                    await completions.send((Completion.refused(request.request_id, refusal), request))
                continue
            for answer in await self._generate(snapshot[0], tokenizer, group, generator, snapshot[1]):
                await completions.send(answer)

    @staticmethod
    def _by_snapshot(requests: list[GenerationRequest]) -> list[tuple[str, list[GenerationRequest]]]:
        groups: dict[str, list[GenerationRequest]] = {}
        for request in requests:
            groups.setdefault(request.policy_id, []).append(request)
        return list(groups.items())

    async def _snapshot(self, policy: str) -> tuple[tuple | None, str]:
        """((model, version), "") of a snapshot of this actor's policy, loaded on first use; (None, the reason)
        (logged, counted) for a policy this actor does not serve or a snapshot that fails its checksums."""
        if policy in self._snapshots:
            self._snapshots.move_to_end(policy)
            return self._snapshots[policy], ""
        parsed = parse_snapshot_id(policy)
        try:
            if parsed is None or parsed[0] != self.cfg.policy_id or not self.cfg.snapshot_dir:
                raise SnapshotError(f"{self.name} serves {self.cfg.policy_id!r} and its snapshots "
                                    f"(snapshot_dir={self.cfg.snapshot_dir}), not {policy!r}")
            path = f"{self.cfg.snapshot_dir}/{policy}"
            model, _ = await trio.to_thread.run_sync(lambda: self._placed(load_snapshot(path)))
        except (SnapshotError, OSError) as error:
            self._stats["unknown_policy"] = self._stats.get("unknown_policy", 0) + 1
            log.warning("%s: requests for %s refused: %s", self.name, policy, error)
            return None, str(error)
        self._snapshots[policy] = (model, parsed[1])
        self._stats["snapshots_loaded"] = self._stats.get("snapshots_loaded", 0) + 1
        while len(self._snapshots) > self.cfg.max_snapshots:
            self._snapshots.popitem(last=False)
        return self._snapshots[policy], ""

    async def _serve_streams(self, queue_out, sampler, completions, snapshots) -> None:
        """vllm: every request for the live policy a task of its own, up to ``max_batch`` in flight; the engine
        batches them. Requests for snapshots go to ``snapshots`` (``_serve_snapshots``)."""
        slots = trio.Semaphore(self.cfg.max_batch)
        async with trio.open_nursery() as nursery:
            while True:
                idle_from = time.perf_counter()
                request = await queue_out.receive()
                if request.policy_id != self.cfg.policy_id:
                    await snapshots.send(request)
                    continue
                if slots.value == self.cfg.max_batch:  # nothing was in flight while it waited
                    self._stats["idle_s"] += time.perf_counter() - idle_from
                await slots.acquire()
                nursery.start_soon(self._answer, request, sampler, completions, slots)

    async def _answer(self, request: GenerationRequest, sampler, completions, slots: trio.Semaphore) -> None:
        try:
            await self.weights.wait_for(request.min_version)
            try:
                s = await sampler.sample(request.prompt_ids, temperature=request.temperature,
                                         max_tokens=request.max_tokens)
            except ValueError as error:  # RequestRefused, an empty prompt: answer this request, serve the rest
                log.warning("%s: request %d refused by the engine: %s", self.name, request.request_id, error)
                self._stats["refused_requests"] += 1
                await completions.send((Completion.refused(request.request_id, str(error)), request))
                return
            self._stats["requests"] += 1
            self._stats["tokens"] += len(s.tokens)
            await completions.send((Completion(request.request_id, s.tokens, s.logprobs, s.versions, s.finished),
                                    request))
        finally:
            slots.release()

    async def _generate(self, model, tokenizer, batch: list[GenerationRequest], generator,
                        frozen_version: int | None = None):
        """Sample every request of the batch; requests with the same sampling settings and prompts of lengths
        within 2x (``microbatches.cut``: a role game's long proposer prompts pad no short solver prompt) share one
        pass. ``frozen_version``: the model is a snapshot of that version (no new weights go into it)."""
        groups: dict[tuple, list[GenerationRequest]] = {}
        for request in sorted(batch, key=lambda r: -len(r.prompt_ids)):  # longest first, as ``cut`` takes them
            groups.setdefault((request.temperature, request.max_tokens), []).append(request)
        passes = []  # (temperature, max_tokens, requests)
        for (temperature, max_tokens), requests in groups.items():
            for rows in cut(range(len(requests)), [len(r.prompt_ids) for r in requests], None):
                passes.append((temperature, max_tokens, [requests[i] for i in rows]))
        results, started = [], time.perf_counter()
        load = loading_into(model)
        swap = (lambda: self.weights.swap(load)) if self.cfg.interruptible and frozen_version is None else None
        for temperature, max_tokens, requests in passes:
            if swap is not None and not self.weights.live:  # the learner started again since the batch began
                await self.weights.wait_for(0, load)
            samples = await trio.to_thread.run_sync(lambda: sample(
                model, [r.prompt_ids for r in requests], eos_id=tokenizer.eos_token_id,
                pad_id=tokenizer.pad_token_id, temperature=temperature, max_new_tokens=max_tokens,
                generator=generator, version=self.weights.version if frozen_version is None else frozen_version,
                swap_weights=swap))
            for request, s in zip(requests, samples):
                completion = Completion(request.request_id, s.tokens, s.logprobs, s.versions, s.finished)
                results.append((completion, request))
                self._stats["tokens"] += len(s.tokens)
        self._stats["generate_s"] += time.perf_counter() - started
        self._stats["requests"] += len(batch)
        self._stats["batches"] += 1
        return results

    def statistics(self) -> RolloutStatistics:
        inbox = self._inbox.statistics() if self._inbox else {}
        wall = time.perf_counter() - self._started_at
        return {**self._stats, **self.weights.statistics(), **self._checks.statistics(),
                "backend": self.cfg.backend, "dropped_frames": inbox.get("dropped_frames", 0),
                "idle_fraction": min(self._stats["idle_s"] / wall, 1.0) if wall > 0 else 0.0,
                "queued_requests": self._queue.statistics().current_buffer_used if self._queue else 0,
                "weights": self._follower.stats if self._follower else {},
                "vllm": dict(self._sampler.stats) if self._sampler else {},
                "streams": {name: s.statistics() for name, s in self._streams.items()}}


def loading_into(model) -> Load:
    """The hf engine's load: weights copied into ``model``'s parameters in place (so they take its device and
    dtype), in a worker thread; the model is idle meanwhile (between batches, or with its sampling thread waiting
    in a swap)."""
    async def load(version: int, tensors) -> None:
        await trio.to_thread.run_sync(load_weights, model, tensors)

    return load
