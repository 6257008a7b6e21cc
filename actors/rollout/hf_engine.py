"""The ``hf`` engine: a Hugging Face causal LM serving the live policy and a league's snapshots, sampled with
`actors.rollout.sampling.sample` (interruptible, every token's log-prob and policy version recorded).

Every tensor is made on the model's device (a GPU with ``rollout.args.device``); what comes back is plain Python
lists.

`HfSampler` samples a batch of requests with a model in passes (`passes`), in a worker thread; `HfEngine` serves the
live policy with it, and `SnapshotCache` a league's frozen snapshots (with either engine: the ``vllm`` engine holds
one set of weights, the live policy's). A completion ends at EOS or at one of the sampler's stop strings
(``sampling.stop``, kept in the completion: `actors.rollout.sampling`), for the live policy and snapshots alike.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict

import torch
import trio

from actors.models.padding import cut
from actors.models.snapshots import SnapshotError, load_snapshot, parse_snapshot_id
from actors.rollout.sampling import StopStrings, device_generator, sample
from actors.rollout.serving import Answer, Served, waiting
from actors.rollout.weights import HeldWeights
from streams.messages import Completion, GenerationRequest
from streams.weights import load_weights

log = logging.getLogger(__name__)


def passes(batch: list[GenerationRequest]) -> list[list[GenerationRequest]]:
    """``batch`` in passes that one `sample` call takes: one temperature and token budget each, and prompts of
    lengths within 2x (``actors.models.padding.cut``: a role game's long proposer prompts pad no short solver
    prompt)."""
    groups: dict[tuple, list[GenerationRequest]] = {}
    for request in sorted(batch, key=lambda r: -len(r.prompt_ids)):  # longest first, as ``cut`` takes them
        groups.setdefault((request.temperature, request.max_tokens), []).append(request)
    return [[requests[i] for i in rows] for requests in groups.values()
            for rows in cut(range(len(requests)), [len(r.prompt_ids) for r in requests], None)]


class HfSampler:
    """Batches of requests sampled with transformers models on the actor's device, in its dtype: a batch in
    `passes`, each in a worker thread, all drawing from one random generator on the device (seeded from the
    actor's seed). What it samples is counted in ``served``. ``stop``: the stop strings (`StopStrings`), or None."""

    def __init__(self, tokenizer, device: torch.device, dtype: torch.dtype, seed: int, served: Served,
                 stop: StopStrings | None = None):
        self.tokenizer, self.device, self.dtype, self.served, self.stop = tokenizer, device, dtype, served, stop
        self.generator = device_generator(device, seed)

    def place(self, model):
        """``model`` on the device, in the dtype (no copy if it is there already)."""
        return model.to(device=self.device, dtype=self.dtype)

    @contextmanager
    def counting(self, batch: list[GenerationRequest]):
        """Count ``batch`` as served, and the time it took, when the block that samples it ends."""
        started = time.perf_counter()
        yield
        self.served.generate_s += time.perf_counter() - started
        self.served.requests += len(batch)
        self.served.batches += 1

    async def generate(self, model, batch: list[GenerationRequest], version: int) -> list[Answer]:
        """``batch`` sampled with ``model``, whose weights do not change (a snapshot of ``version``)."""
        answers = []
        with self.counting(batch):
            for requests in passes(batch):
                answers += await self.sample_pass(model, requests, version)
        return answers

    async def sample_pass(self, model, requests: list[GenerationRequest], version: int,
                          swap: Callable[[], int | None] | None = None) -> list[Answer]:
        """One of `passes`, sampled with ``model``, whose weights are of ``version`` now (``swap``: `sample`'s
        ``swap_weights``)."""
        first = requests[0]
        samples = await trio.to_thread.run_sync(lambda: sample(
            model, [r.prompt_ids for r in requests], eos_id=self.tokenizer.eos_token_id,
            pad_id=self.tokenizer.pad_token_id, temperature=first.temperature, max_new_tokens=first.max_tokens,
            generator=self.generator, version=version, swap_weights=swap, stop=self.stop))
        self.served.tokens += sum(len(s.tokens) for s in samples)
        return [(Completion(r.request_id, s.tokens, s.logprobs, s.versions, s.finished), r)
                for r, s in zip(requests, samples)]


class SnapshotCache:
    """A league member's frozen snapshots, served beside its live policy by the hf sampler, with either engine.

    A request whose ``policy_id`` is a snapshot id ``<policy_id>-v<n>`` is sampled with that snapshot's weights,
    loaded from ``directory`` on first use (checked against its checksums) and kept, up to ``capacity`` of them,
    the least recently used out. Its tokens carry the snapshot's version."""

    def __init__(self, sampler: HfSampler, policy_id: str, directory: str | None, capacity: int, name: str):
        self.sampler, self.policy_id, self.name = sampler, policy_id, name
        self.directory, self.capacity = directory, capacity
        self._models: OrderedDict[str, tuple] = OrderedDict()  # snapshot id -> (model, version), least recent first
        self._stats: dict[str, int] = {}  # unknown_policy, snapshots_loaded: each counted from its first

    async def sample(self, requests: list[GenerationRequest], completions: trio.MemorySendChannel) -> None:
        """Answer ``requests`` for snapshots, a snapshot's in one batch; those for a snapshot that is refused, each
        with the reason (its env drops that episode)."""
        by_policy: dict[str, list[GenerationRequest]] = {}
        for request in requests:
            by_policy.setdefault(request.policy_id, []).append(request)
        for policy, group in by_policy.items():
            try:
                model, version = await self.get(policy)
            except SnapshotError as error:
                for request in group:
                    await completions.send((Completion.refused(request.request_id, str(error)), request))
                continue
            for answer in await self.sampler.generate(model, group, version):
                await completions.send(answer)

    async def get(self, policy: str) -> tuple[torch.nn.Module, int]:
        """(model, version) of the snapshot ``policy`` of this actor's policy, loaded on first use.
        SnapshotError (logged, counted) for a policy this actor does not serve or a snapshot that fails its
        checksums."""
        if policy in self._models:
            self._models.move_to_end(policy)
            return self._models[policy]
        parsed = parse_snapshot_id(policy)
        try:
            if parsed is None or parsed[0] != self.policy_id or not self.directory:
                raise SnapshotError(f"{self.name} serves {self.policy_id!r} and its snapshots "
                                    f"(snapshot_dir={self.directory}), not {policy!r}")
            path = f"{self.directory}/{policy}"
            model = await trio.to_thread.run_sync(lambda: self.sampler.place(load_snapshot(path)[0]))
        except (SnapshotError, OSError) as error:
            self._stats["unknown_policy"] = self._stats.get("unknown_policy", 0) + 1
            log.warning("%s: requests for %s refused: %s", self.name, policy, error)
            if isinstance(error, OSError):
                raise SnapshotError(str(error)) from error
            raise
        self._models[policy] = (model, parsed[1])
        self._stats["snapshots_loaded"] = self._stats.get("snapshots_loaded", 0) + 1
        while len(self._models) > self.capacity:
            self._models.popitem(last=False)
        return self._models[policy]

    def statistics(self) -> dict:
        return dict(self._stats)


PARKED_BATCHES = 4  # an hf engine puts aside at most this many batches of requests waiting for newer weights


class HfEngine:
    """The ``hf`` engine: the live policy as a transformers model on the actor's device (`HfSampler`).

    The requests that wait are taken in one batch (up to ``max_batch``); new weights are loaded between batches
    and (``interruptible``) between two decoding steps. A request whose ``min_version`` is newer than the weights
    held is put aside (at most ``PARKED_BATCHES`` batches of them) and sampled in a later batch once they are
    loaded; the rest of its batch goes on. One put aside for longer than the weights' ``wait_s``, or whose version
    lies beyond what the learner announced, is answered with the refusal (`HeldWeights.refusal`): one request for
    version 10**12 once stopped the engine for every requester. The snapshots' requests in the batch are sampled
    after the live policy's. ``latency_s``: seconds every batch takes on top of sampling, as on a remote or much
    larger engine."""

    def __init__(self, model, sampler: HfSampler, snapshots: SnapshotCache, weights: HeldWeights, *,
                 max_batch: int, interruptible: bool = True, latency_s: float = 0.0):
        self.model, self.sampler, self.snapshots, self.weights = model, sampler, snapshots, weights
        self.tokenizer, self.served = sampler.tokenizer, sampler.served
        self.max_batch, self.interruptible, self.latency_s = max_batch, interruptible, latency_s

    async def load(self, version: int, tensors) -> None:
        """Copy weights into the model's parameters in place (so they take its device and dtype), in a worker
        thread; the model is idle meanwhile (between batches, or with its sampling thread waiting in a swap)."""
        await trio.to_thread.run_sync(load_weights, self.model, tensors)

    async def serve(self, requests: trio.MemoryReceiveChannel, completions: trio.MemorySendChannel) -> None:
        parked: list[tuple[float, GenerationRequest]] = []  # (deadline, request): waiting for newer weights
        while True:
            idle_from = time.perf_counter()
            batch = await self._take(requests, parked)
            self.served.idle_s += time.perf_counter() - idle_from
            if self.latency_s and batch:
                await trio.sleep(self.latency_s)  # the emulated engine's latency: this batch is busy meanwhile
            live = [r for r in batch if r.policy_id == self.weights.policy_id]
            if live or parked:
                await self.weights.wait_for(0, self.load)  # what arrived; a dead life's held: the live one's
                ready, refused = self._sort(live, parked)
                for request, why in refused:
                    await completions.send((Completion.refused(request.request_id, why), request))
                for start in range(0, len(ready), self.max_batch):
                    for answer in await self.generate(ready[start:start + self.max_batch]):
                        await completions.send(answer)
            await self.snapshots.sample([r for r in batch if r.policy_id != self.weights.policy_id], completions)

    def _sort(self, live: list[GenerationRequest], parked: list) -> tuple[list, list]:
        """The live requests (new ones, and those ``parked``) that the weights held serve now, and those to refuse
        with the reason; the rest stay in ``parked``, new ones counted as waits."""
        deadline, held = self.weights.deadline(), self.weights.version
        waiting = parked + [(deadline, r) for r in live]
        ready = [r for _, r in waiting if r.min_version <= held]
        self.weights.waited(sum(r.min_version > held for r in live))
        refused, parked[:] = [], []
        for deadline, request in waiting:
            if request.min_version > held:
                if why := self.weights.refusal(request.min_version, deadline):
                    refused.append((request, why))
                else:
                    parked.append((deadline, request))
        return ready, refused

    async def _take(self, requests: trio.MemoryReceiveChannel, parked: list) -> list[GenerationRequest]:
        """What is waiting in ``requests`` (up to ``max_batch``, waiting for the first); with requests ``parked``,
        only until weights arrive or load, a life is announced or the first of them may wait no longer, and
        nothing new once ``PARKED_BATCHES`` batches of them wait (the actor's queue then fills: backpressure)."""
        if not parked:
            return await waiting(requests, self.max_batch)
        held, changed = self.weights.version, self.weights.next_change()
        if self.weights.pending or any(r.min_version <= held for _, r in parked):  # a swap mid-batch loaded them
            return []
        taken = []
        with trio.move_on_at(min(deadline for deadline, _ in parked)):
            async with trio.open_nursery() as nursery:
                async def take():
                    taken.extend(await waiting(requests, self.max_batch))
                    nursery.cancel_scope.cancel()

                async def weights_changed():
                    await changed.wait()
                    nursery.cancel_scope.cancel()

                if len(parked) < PARKED_BATCHES * self.max_batch:
                    nursery.start_soon(take)
                nursery.start_soon(weights_changed)
        return taken

    async def generate(self, batch: list[GenerationRequest]) -> list[Answer]:
        """``batch`` sampled with the live policy, as the weights held are now and as they change."""
        swap = (lambda: self.weights.swap(self.load)) if self.interruptible else None
        answers = []
        with self.sampler.counting(batch):
            for requests in passes(batch):
                if swap is not None and not self.weights.live:  # the learner started again since the batch began
                    await self.weights.wait_for(0, self.load)
                answers += await self.sampler.sample_pass(self.model, requests, self.weights.version, swap)
        return answers

    def statistics(self) -> dict:
        return {**asdict(self.served), **self.snapshots.statistics()}

    def close(self) -> None:
        """Nothing to release: the model goes with the actor."""
