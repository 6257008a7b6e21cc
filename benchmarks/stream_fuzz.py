"""The fuzzer of benchmarks/streams.py: bad frames at every kind of receiving endpoint of live actors.

Every actor runs in this process on one trio loop (`LocalCluster`) over real ZeroMQ sockets. At each
receiving endpoint the fuzzer sends random, truncated, oversized, wrong-version, unknown-kind and wrong-kind
frames, frames with the wrong number of parts and (on the lossless links) bad link envelopes and repeated
sequence numbers. Then it checks that the endpoint's counters account for every frame and that the actors
still answer and serve.
"""

from __future__ import annotations

import random
import time

import trio
import zmq

from actors.engines.base_model import TinyModelConfig, ensure_base_model
from benchmarks.fixtures import trajectory_batch
from streams.endpoints import Inbox, Outbox
from actors.env import EnvActor, EnvConfig
from actors.host import LocalCluster
from actors.learner import LearnerActor, LearnerConfig
from actors.replay import ReplayActor, ReplayConfig
from actors.reward import RewardActor, RewardConfig
from actors.rollout import RolloutActor, RolloutConfig
from streams.messages import (
    VERSION_TOPIC, WEIGHTS_TOPIC, Completion, GenerationRequest, VersionAnnounced, WeightsFetch, WeightsManifest,
)
from streams.schema import encode_table
from streams.wire import FRAME_LIMITS, WIRE_VERSION, FrameCounter, Kind, LinkType, encode_link, pack

SINK = "tcp://127.0.0.1:9"  # where the actors' own output goes: nothing listens, nothing is read
FUZZ_MODEL = TinyModelConfig(warmup_games=50, warmup_steps=1, warmup_batch=8)  # weights do not matter here
OVERSIZED_BYTES = 300 * 2**20  # at most this many bytes of oversized frames per endpoint


def example_bodies() -> dict[Kind, bytes]:
    episode = encode_table(trajectory_batch(1))
    return {
        Kind.GENERATE: GenerationRequest(1, SINK, "main", [1, 2, 3], 1.0, 4).to_body(),
        Kind.COMPLETION: Completion(1, [5], [-0.5], [0], True).to_body(),
        Kind.EPISODES: episode, Kind.BATCH: episode,
        Kind.WEIGHTS: WeightsManifest("main", 9, 10, 4, [0, 0, 0], "h", "/nowhere", SINK).to_body(),
        Kind.VERSION: VersionAnnounced("main", 3).to_body(),
        Kind.WEIGHTS_FETCH: WeightsFetch("main", 0, 0, SINK).to_body(),
        Kind.WEIGHTS_CHUNK: b"",
    }


def header(kind: str, v: int = WIRE_VERSION) -> bytes:
    return pack({"kind": kind, "v": v, "sender": "fuzzer", "seq": 0})


class FrameMaker:
    """Bad frames for an endpoint of one kind, in every category, from a seeded generator."""

    def __init__(self, kind: Kind, bodies: dict[Kind, bytes], count: int, seed: int):
        self.kind, self.bodies, self.rng = kind, bodies, random.Random(seed)
        self.valid = FrameCounter("fuzzer").frame(kind, bodies[kind])
        other = next(k for k in bodies if k not in (kind, Kind.WEIGHTS_CHUNK))
        self.wrong_kind = FrameCounter("fuzzer").frame(other, bodies[other])
        self.oversized_left = max(1, min(count // 10, OVERSIZED_BYTES // FRAME_LIMITS[kind]))

    def make(self) -> list[bytes]:
        rng, (head, body) = self.rng, self.valid
        choice = rng.randrange(9)
        if choice == 8 and self.oversized_left:
            self.oversized_left -= 1
            return [head, b"\0" * (FRAME_LIMITS[self.kind] + 1)]
        if choice == 0:
            return [rng.randbytes(rng.randrange(65)), rng.randbytes(rng.randrange(257))]
        if choice == 1:
            return [head, rng.randbytes(rng.randrange(1, 2049))]
        if choice == 2:
            return [head[:rng.randrange(len(head))], body]
        if choice == 3:  # cut into the body (an Arrow stream keeps its last 8 bytes: the end marker)
            return [head, body[:rng.randrange(max(1, len(body) - 8))]]
        if choice == 4:
            return [header(self.kind.value, v=WIRE_VERSION + 1 + rng.randrange(5)), body]
        if choice == 5:
            return [header("telepathy"), body]
        if choice == 6:
            return list(self.wrong_kind)
        return rng.choice([[head], [head, body, body], []])


def endpoint_count(stats: dict) -> int:
    """Frames an endpoint has accounted for: dropped by its link, repeated, or handed to its inbox."""
    return stats["dropped"] + stats["duplicates"] + stats["received"]


def wait_until(predicate, timeout: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.002)
    return False


class Fuzzer:
    def __init__(self, frames: int):
        self.frames, self.cluster, self.ctx = frames, LocalCluster(transport="zmq"), zmq.Context.instance()
        self.bodies = example_bodies()
        self.publisher = self.ctx.socket(zmq.PUB)
        self.publisher.setsockopt(zmq.SNDHWM, 0)
        self.pub_address = f"tcp://127.0.0.1:{self.publisher.bind_to_random_port('tcp://127.0.0.1')}"
        self.results: list[dict] = []

    def spawn(self, model: str) -> dict:
        c = self.cluster
        learner = c.spawn("learner", LearnerActor, LearnerConfig(model_path=model), peers={})
        replay = c.spawn("replay", ReplayActor, ReplayConfig(batch_episodes=1, capacity_episodes=4),
                         peers={"learner": [SINK]})
        reward = c.spawn("reward", RewardActor, RewardConfig(), peers={"replay": [SINK]})
        rollout = c.spawn("rollout", RolloutActor, RolloutConfig(model_path=model), peers={"weights": [self.pub_address]})
        env = c.spawn("env", EnvActor, EnvConfig(tokenizer_path=model),
                      peers={"rollout": [SINK], "reward": [SINK], "versions": [self.pub_address]})
        return {"learner": learner, "replay": replay, "reward": reward, "rollout": rollout, "env": env}

    def stats(self, actor: str, stream: str) -> dict | None:
        try:
            return self.cluster.statistics(actor)["streams"][stream]
        except Exception:  # the loop has died: a crash
            return None

    def fuzz_link(self, actor: str, stream: str, address: str, kind: Kind) -> dict:
        """A lossless endpoint: frames on a raw DEALER that speaks the link protocol, and breaks it too."""
        before = endpoint_count(self.stats(actor, stream))
        peer, maker, rng = self.ctx.socket(zmq.DEALER), FrameMaker(kind, self.bodies, self.frames, 1), random.Random(2)
        peer.setsockopt(zmq.SNDHWM, 0)
        peer.connect(address)
        seq = 0
        for i in range(self.frames):
            roll = rng.random()
            if roll < 0.05:
                peer.send_multipart([rng.randbytes(rng.choice([0, 15, 17])), b"body"], copy=False)  # no envelope
            elif roll < 0.10 and seq:
                peer.send_multipart([encode_link(LinkType.DATA, rng.randrange(seq)), b"again"])  # a repeat
            else:
                peer.send_multipart([encode_link(LinkType.DATA, seq), *maker.make()], copy=False)
                seq += 1
        return self.settle(actor, stream, kind, before, peer)

    def fuzz_subscription(self, actor: str, stream: str, topic: bytes, kind: Kind) -> dict:
        """A subscription may drop when full, so frames go a few at a time, each burst accounted first."""
        maker, probe = FrameMaker(kind, self.bodies, self.frames, 3), [topic, b"probe"]
        start = endpoint_count(self.stats(actor, stream))
        joined = wait_until(lambda: self.publisher.send_multipart(probe) or endpoint_count(self.stats(actor, stream)) > start, 30)
        before = endpoint_count(self.stats(actor, stream)) if joined else start
        for burst in range(0, self.frames, 3):
            size = min(3, self.frames - burst)
            for _ in range(size):
                self.publisher.send_multipart([topic, *maker.make()], copy=False)
            target = before + burst + size
            if not wait_until(lambda: (s := self.stats(actor, stream)) is None or endpoint_count(s) >= target, 30):
                break
        return self.settle(actor, stream, kind, before, None)

    def settle(self, actor: str, stream: str, kind: Kind, before: int, peer) -> dict:
        wait_until(lambda: (s := self.stats(actor, stream)) is None or endpoint_count(s) - before >= self.frames)
        if peer is not None:
            peer.close(0)
        after = self.stats(actor, stream)
        result = {"endpoint": f"{actor}.{stream}", "kind": kind.value, "sent": self.frames,
                  "accounted": None if after is None else endpoint_count(after) - before,
                  "crashed": after is None, "by_reason": after and after.get("dropped_by_reason"),
                  "link": after and {"no_envelope": after["dropped"], "repeated": after["duplicates"]}}
        self.results.append(result)
        return result

    def still_serves(self) -> bool:
        """The rollout answers a real request, and the reward actor scores a real episode."""
        async def ask():
            transport = self.cluster.transport
            async with transport.open_receiver() as replies, transport.open_sender([self.addresses["rollout"]["requests"]]) as out:
                await Outbox(out, Kind.GENERATE, "checker").send(
                    GenerationRequest(42, replies.address, "main", [1, 2, 3], 1.0, 2).to_body())
                with trio.move_on_after(60):
                    return (await Inbox(replies, Kind.COMPLETION, Completion.from_body).receive()).request_id == 42
                return False

        try:
            scored = self.cluster.statistics("reward")["episodes"]
            answered = trio.run(ask)
            sender = self.ctx.socket(zmq.DEALER)
            sender.connect(self.addresses["reward"]["episodes"])
            sender.send_multipart([encode_link(LinkType.DATA, 0), *FrameCounter("checker").frame(Kind.EPISODES, self.bodies[Kind.EPISODES])])
            ok = wait_until(lambda: self.cluster.statistics("reward")["episodes"] == scored + 1, 30)
            sender.close(0)
            return answered and ok
        except Exception as error:  # noqa: BLE001 - any failure here means the actors stopped serving
            print(f"fuzz: the actors stopped serving: {error!r}")
            return False

    def run(self) -> dict:
        model = str(ensure_base_model("~/.cache/tidal/models", FUZZ_MODEL))
        try:
            self.addresses = a = self.spawn(model)
            for actor, stream, address, kind in [
                ("learner", "batches", a["learner"]["batches"], Kind.BATCH),
                ("learner", "fetch", a["learner"]["fetch"], Kind.WEIGHTS_FETCH),
                ("replay", "episodes", a["replay"]["episodes"], Kind.EPISODES),
                ("reward", "episodes", a["reward"]["episodes"], Kind.EPISODES),
                ("rollout", "requests", a["rollout"]["requests"], Kind.GENERATE),
                ("env", "completions", a["env"]["completions"], Kind.COMPLETION),
            ]:
                report(self.fuzz_link(actor, stream, address, kind))
            report(self.fuzz_subscription("rollout", "weights", WEIGHTS_TOPIC + b"main", Kind.WEIGHTS))
            report(self.fuzz_subscription("env", "versions", VERSION_TOPIC + b"main", Kind.VERSION))
            serving = self.still_serves()
        finally:
            self.cluster.shutdown()
            self.publisher.close(0)
        crashes = sum(r["crashed"] or r["accounted"] != r["sent"] for r in self.results) + (not serving)
        return {"frames": sum(r["sent"] for r in self.results), "crashes": crashes, "serving": serving}


def report(result: dict) -> None:
    counts = {**(result["link"] or {}), **(result["by_reason"] or {})}
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()) if v)
    print(f"fuzz {result['endpoint']:>20} ({result['kind']}): {result['sent']} frames, "
          f"{result['accounted']} accounted for{' - CRASHED' if result['crashed'] else ''} [{reasons}]", flush=True)


def fuzz_live_actors(frames_per_endpoint: int) -> dict:
    result = Fuzzer(frames_per_endpoint).run()
    print(f"fuzz: actors still serving: {result['serving']}", flush=True)
    return result
