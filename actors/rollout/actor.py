"""RolloutActor: owns a generation engine and a policy version; answers generation requests.

Two engines (``backend``), chosen once when the actor starts, behind one interface (`actors.rollout.serving.Engine`)
and with one output: tokens, the behaviour log-prob and the policy version of every token, each completion sent to
the address named in its request.

- ``hf`` (`HfEngine`): requests from every env actor queue up; the actor takes as many as are waiting (up to
  ``max_batch``) and samples them in one batch in a worker thread. New weights are applied between batches, or
  in the middle of one (interruptible generation).
- ``vllm`` (`VllmEngine`): every request is a trio task on vLLM's async engine, which batches them continuously,
  up to ``max_batch`` at once. New weights are loaded into the running engine as soon as they arrive; requests in
  flight resume from their prefix with them.

Either way a request waits until the actor holds weights at least as new as its ``min_version``, so no
token is older than the learner version its env actor acted on; it waits on its own (the rest of its batch goes
on) and for at most ``version_wait_s``, and one whose ``min_version`` lies beyond the newest version announced
(plus a slack) is refused on arrival. A restarted learner is a new *life*: the actor
follows it even to a lower version, and samples nothing more with the dead life's weights once the new one
announced itself (`HeldWeights`, ``actors/rollout/weights.py``). A request it must not sample (a prompt token
outside the tokenizer's vocabulary, a negative ``min_version``: `streams.values.RequestChecks`) is refused on arrival.

In a league the actor also serves its member's frozen snapshots: a request whose ``policy_id`` is a snapshot id
``<policy_id>-v<n>`` is sampled with that snapshot's weights, loaded from ``snapshot_dir`` on first use (checked
against its checksums) and kept, up to ``max_snapshots`` of them, the least recently used out. Its tokens carry
the snapshot's version. One process serves the live policy and every snapshot; snapshots are sampled by the
``hf`` sampler with either backend (`SnapshotCache`; with ``vllm``, beside the engine, in batches of the snapshot
requests that are waiting: the engine holds one set of weights, the live policy's).

``device`` and ``dtype`` place the models the ``hf`` sampler runs (the live policy with ``hf``, and snapshots):
``auto`` is CUDA in bfloat16 when a GPU is visible, else the CPU in float32 (`actors/models/devices.py`). New
weights are copied into the model's parameters, so they take its device and dtype. The ``vllm`` engine runs on
its build's platform, in ``vllm.dtype`` (null: this ``dtype``).

``stop`` (the run's ``sampling.stop``): strings that end a completion in either engine, and in the snapshots'
sampler, kept in the completion (`actors.rollout.sampling`); a completion's ``finished`` is true when it ended at
EOS or a stop string, false when ``max_tokens`` cut it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field

import torch
import trio

from actors.models.base_model import load_policy, stored_parameters
from actors.models.devices import check_device, check_dtype, resolve_device, resolve_dtype
from actors.rollout.face import RolloutStatistics
from actors.rollout.hf_engine import HfEngine, HfSampler, SnapshotCache
from actors.rollout.sampling import StopStrings, stop_problems
from actors.rollout.serving import Engine, Served, waiting
from actors.rollout.vllm_engine import MAX_TEMPERATURE, VllmEngine, VllmOptions, VllmSampler
from actors.rollout.weights import VERSION_WAIT_S, HeldWeights
from streams.endpoints import Inbox
from streams.messages import (VERSION_TOPIC, WEIGHTS_TOPIC, Completion, decode_requests, encode_completions,
                             split_completions)
from streams.replies import open_replies
from streams.values import RequestChecks
from streams.weights import LearnerFeed, WeightsFollower
from streams.wire import FRAME_LIMITS, Kind

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
    stop: list[str] = field(default_factory=list)  # sampling.stop: strings that end a completion, kept in it
    # the most bytes a published version may claim (null: 4 a number of the model, as the learner publishes fp32,
    # and room for the safetensors header); a manifest that claims more is refused before anything is allocated
    max_weights_bytes: int | None = None
    version_wait_s: float = VERSION_WAIT_S  # the longest a request waits for its min_version's weights (then refused)

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
        if not self.version_wait_s > 0:
            raise ValueError(f"rollout version_wait_s must be > 0 seconds, not {self.version_wait_s!r}")
        if self.max_weights_bytes is not None and self.max_weights_bytes < 1:
            raise ValueError(f"rollout max_weights_bytes must be a positive size (or null), not "
                             f"{self.max_weights_bytes}")
        if problems := stop_problems(self.stop):
            raise ValueError("; ".join(problems))
        self.stop = list(self.stop)


BACKENDS = ("hf", "vllm")


class RolloutActor:
    def __init__(self, cfg: RolloutConfig, name: str = "rollout"):
        self.cfg, self.name = cfg, name
        self.weights = HeldWeights(cfg.policy_id, name, cfg.version_wait_s)  # the learner's newest, and the engine's
        self.engine: Engine | None = None  # started by `run`
        self._started_at = time.perf_counter()
        self._queue = None
        self._follower = None
        self._streams: dict = {}
        self._inbox = None
        self._checks = RequestChecks(name)  # what a request must hold before it is queued

    async def run(self, transport, peers: dict, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self.engine = engine = await trio.to_thread.run_sync(start_engine, self.cfg, self.weights, self.name)
        queue_in, queue_out = trio.open_memory_channel(4 * self.cfg.max_batch)
        completions_in, completions_out = trio.open_memory_channel(self.cfg.max_batch)
        self._queue = queue_out
        policy = self.cfg.policy_id.encode()
        try:
            async with (
                # parts no larger than a frame of requests: a peer sending a larger one is cut off
                transport.open_receiver(capacity=1024, max_message_bytes=FRAME_LIMITS[Kind.GENERATE]) as requests,
                transport.open_subscriber(peers.get("weights", []), topics=[VERSION_TOPIC + policy,
                                                                            WEIGHTS_TOPIC + policy]) as weights,
                trio.open_nursery() as nursery,
            ):
                self._inbox = Inbox(requests, Kind.GENERATE, decode_requests)  # a batch of requests a frame
                manifests = LearnerFeed(weights)  # versions and lives, and manifests, in order
                self._follower = WeightsFollower(transport, shared_memory=self.cfg.weights_shared_memory,
                                                 max_bytes=await trio.to_thread.run_sync(weights_limit, self.cfg))
                self._streams = {"requests": self._inbox, "weights": manifests}
                nursery.start_soon(self._queue_requests, queue_in, completions_in, len(engine.tokenizer))
                nursery.start_soon(self.weights.follow, manifests, self._follower)
                nursery.start_soon(self._send_completions, completions_out, transport)
                nursery.start_soon(engine.serve, queue_out, completions_in)
                task_status.started({"requests": requests.address})
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(engine.close)

    async def _queue_requests(self, queue_in, completions, vocab_size: int) -> None:
        while True:
            for request in await self._inbox.receive():
                # counted and logged; the env drops its episode
                if refusal := self._checks.refusal(request, vocab_size, self.weights.announced):
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
                for completion, request in await waiting(completions, self.cfg.max_batch):
                    by_address.setdefault(request.reply_to, []).append(completion)
                for address, answers in by_address.items():
                    for batch in split_completions(answers):
                        replies.post(address, encode_completions(batch))

    def statistics(self) -> RolloutStatistics:
        inbox = self._inbox.statistics() if self._inbox else {}
        wall = time.perf_counter() - self._started_at
        engine = self.engine.statistics() if self.engine else dataclasses.asdict(Served())
        return {**engine, **self.weights.statistics(), **self._checks.statistics(),
                "backend": self.cfg.backend, "dropped_frames": inbox.get("dropped_frames", 0),
                "idle_fraction": min(engine["idle_s"] / wall, 1.0) if wall > 0 else 0.0,
                "queued_requests": self._queue.statistics().current_buffer_used if self._queue else 0,
                "weights": self._follower.stats if self._follower else {},
                "vllm": engine.get("vllm", {}),
                "streams": {name: s.statistics() for name, s in self._streams.items()}}


def weights_limit(cfg: RolloutConfig) -> int | None:
    """The most bytes a version of the model can take when published: ``max_weights_bytes``, else 4 a number the
    model directory stores (the learner publishes fp32) and ``HEADER_ROOM`` for the names and shapes; None where
    the directory stores no safetensors (nothing to bound by but the manifest's own limits)."""
    if cfg.max_weights_bytes is not None:
        return cfg.max_weights_bytes
    numbers = stored_parameters(cfg.model_path)
    return 4 * numbers + HEADER_ROOM if numbers else None


HEADER_ROOM = 16 * 2**20  # a safetensors header: a few hundred bytes a tensor, with room to spare


def engine_problems(backend: str, temperature: float) -> list[str]:
    """What the engine ``backend`` names cannot do with these settings, said with the config's keys before any
    actor starts (the engine is chosen here and in `start_engine` only)."""
    if backend == "vllm" and not 0 < temperature <= MAX_TEMPERATURE:
        return [f"sampling.temperature={temperature}: rollout.backend=vllm samples at temperatures in "
                f"(0, {MAX_TEMPERATURE:g}]"]
    return []


def stop_problems_with(tokenizers: dict, strings: list[str], max_new_tokens: int) -> list[str]:
    """The stop strings that a completion of ``max_new_tokens`` tokens could not hold: those the tokenizer of a
    model (``tokenizers``: model path -> its tokenizer) encodes to more tokens, said with the config's keys (the
    driver checks them once the run's models are at hand, before any actor starts)."""
    problems = []
    for path, tokenizer in tokenizers.items():
        for s in strings:
            count = len(tokenizer(s, add_special_tokens=False)["input_ids"])
            if count > max_new_tokens:
                problems.append(f"sampling.stop: {s!r} is {count} tokens of {path}'s tokenizer, more than "
                                f"sampling.max_new_tokens={max_new_tokens}")
    return problems


def start_engine(cfg: RolloutConfig, weights: HeldWeights, name: str) -> Engine:
    """The engine ``cfg.backend`` names (the one place it is chosen), its model loaded: blocking, so the actor
    calls it in a worker thread. Its hf sampler, on the configured device, samples the hf engine's live policy
    and either engine's snapshots."""
    torch.set_num_threads(cfg.threads)
    try:
        device = resolve_device(cfg.device)
    except RuntimeError as error:
        raise RuntimeError(f"{name}: rollout.args.{error}") from None
    dtype = resolve_dtype(cfg.dtype, device)
    if cfg.backend == "vllm":
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(cfg.model_path)
        stop = StopStrings.of(tokenizer, cfg.stop)
        sampler = HfSampler(tokenizer, device, dtype, cfg.seed, Served(), stop)
        options = dataclasses.replace(cfg.vllm, dtype=cfg.vllm.dtype or cfg.dtype)
        # on a GPU, room for the snapshots the hf sampler may hold beside the engine (`gpu_share`)
        reserve = (cfg.max_snapshots * stored_parameters(cfg.model_path) * dtype.itemsize
                   if cfg.snapshot_dir and device.type == "cuda" else 0)
        vllm = VllmSampler(cfg.model_path, tokenizer.eos_token_id, options=options, threads=cfg.threads,
                           max_seqs=cfg.max_batch, seed=cfg.seed, name=name, stop=stop, reserve_bytes=reserve)
        return VllmEngine(vllm, _snapshots(cfg, sampler, name), weights, max_batch=cfg.max_batch)
    model, tokenizer = load_policy(cfg.model_path)
    sampler = HfSampler(tokenizer, device, dtype, cfg.seed, Served(), StopStrings.of(tokenizer, cfg.stop))
    return HfEngine(sampler.place(model), sampler, _snapshots(cfg, sampler, name), weights, max_batch=cfg.max_batch,
                    interruptible=cfg.interruptible, latency_s=cfg.latency_s)


def _snapshots(cfg: RolloutConfig, sampler: HfSampler, name: str) -> SnapshotCache:
    return SnapshotCache(sampler, cfg.policy_id, cfg.snapshot_dir, cfg.max_snapshots, name)
