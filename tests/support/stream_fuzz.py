"""The fuzzer: bad frames at every kind of receiving endpoint of live actors, then checks that they all still serve.

Every actor (learner, replay, reward, league, rollout, env) runs in this process on one trio loop (`LocalCluster`)
over real ZeroMQ sockets, wired as in a run where it matters (reward -> replay -> learner). At each receiving
endpoint `Fuzzer` sends N frames of every class:

- frames: random bytes, a random body, a cut header, a cut body, another wire version (or ``True`` or ``1.0``, which
  equal 1), an unknown kind, another
  kind, the wrong number of parts, an oversized frame, an oversized multi-part message (each part under the
  limit, together over it) and msgpack shape confusion (the kind's own fields in the wrong shapes and types, or
  msgpack where Arrow belongs);
- below the frames, on the lossless links: no or a broken link envelope, repeated sequence numbers, and sequence
  numbers outside the acknowledgement window (past the window, 2**63, 2**64-1, and a stranger's first message).

Then it checks that each endpoint's counters account for every frame and that every actor still serves: the
rollout skips a well-formed manifest of 1 TiB and refuses a request for version 10**12, then answers a request,
an episode goes reward -> replay -> learner and is trained on, the learner serves a chunk of its weights, the
league assigns a match and takes a result, the env actor counts a stray completion.
`tests/streams/test_hostile_sockets.py` runs it small; `benchmarks/stream_fuzz.py` and `benchmarks/stream_bench.py`
run it at 1,000 or 10,000 frames an endpoint and report `summary`'s part of their last line.
"""

from __future__ import annotations

import random
import tempfile
import time

import trio
import zmq

from actors.models.base_model import TinyModelConfig, ensure_base_model
from actors.env.actor import EnvActor, EnvConfig
from actors.runs.host import LocalCluster
from actors.league.actor import LeagueActor, LeagueConfig
from actors.learner.actor import LearnerActor, LearnerConfig
from actors.replay.actor import ReplayActor, ReplayConfig
from actors.reward.actor import RewardActor, RewardConfig
from actors.rollout.actor import RolloutActor, RolloutConfig
from streams.endpoints import Inbox, Outbox
from streams.messages import (
    MAX_CHUNK_BYTES, VERSION_TOPIC, WEIGHTS_TOPIC, Completion, GenerationRequest, MatchAssigned, MatchRequest,
    MatchResult, VersionAnnounced, WeightsChunk, WeightsFetch, WeightsManifest, decode_completions, decode_requests,
)
from streams.schema import Columns, decode_table, encode_table, trajectory_table
from streams.wire import (
    FRAME_LIMITS, MAX_FIRST_SEQ, WIRE_VERSION, FrameCounter, Kind, LinkType, encode_link, pack, unpack,
)
from tests.support.trajectories import trajectory_batch

SINK = "tcp://127.0.0.1:9"  # where output nobody checks goes: nothing listens, nothing is read
FUZZ_MODEL = TinyModelConfig(warmup_games=50, warmup_steps=1, warmup_batch=8)  # weights do not matter here
OVERSIZED_BYTES = 300 * 2**20  # at most this many bytes of oversized frames per endpoint
DECODERS = {Kind.GENERATE: decode_requests, Kind.COMPLETION: decode_completions,  # what the endpoints decode with
            Kind.EPISODES: decode_table, Kind.BATCH: decode_table, Kind.WEIGHTS: WeightsManifest.from_body,
            Kind.VERSION: VersionAnnounced.from_body, Kind.WEIGHTS_FETCH: WeightsFetch.from_body,
            Kind.MATCH_REQUEST: MatchRequest.from_body, Kind.MATCH_RESULT: MatchResult.from_body}


def example_bodies() -> dict[Kind, bytes]:
    episode = encode_table(trajectory_batch(1))
    return {
        Kind.GENERATE: GenerationRequest(1, SINK, "main", [1, 2, 3], 1.0, 4).to_body(),
        Kind.COMPLETION: Completion(1, [5], [-0.5], [0], True).to_body(),
        Kind.EPISODES: episode, Kind.BATCH: episode,
        Kind.WEIGHTS: WeightsManifest("main", 9, 10, 4, [0, 0, 0], "h", "/nowhere", SINK).to_body(),
        Kind.VERSION: VersionAnnounced("main", 3).to_body(),
        Kind.WEIGHTS_FETCH: WeightsFetch("main", 0, 0, SINK).to_body(),
        Kind.MATCH_REQUEST: MatchRequest(1, SINK, ["main"]).to_body(),
        Kind.MATCH_RESULT: MatchResult(1, "main", ["main", "random"], [1.0, -1.0]).to_body(),
    }


def honest_episode(episode_id: str):
    """One agent-turn the tiny model can train on (its token ids are in its vocabulary)."""
    return trajectory_table([{
        Columns.EPISODE_ID: episode_id, Columns.ENV_NAME: "fuzz", Columns.SEED: 0, Columns.TURN: 0, Columns.AGENT: 0,
        Columns.MATCHUP: "main", Columns.POLICY_ID: "main", Columns.PROMPT_IDS: [1, 2, 3, 4],
        Columns.ACTION_IDS: [5, 6],
        Columns.ACTION_TEXT: "x", Columns.BEHAVIOUR_LOGPROBS: [-0.5, -0.7], Columns.POLICY_VERSIONS: [0, 0],
        Columns.REWARD: 1.0, Columns.TERMINATED: True, Columns.TRUNCATED: False, Columns.EPISODE_RETURN: 1.0,
        Columns.INVALID_ACTION: False, Columns.CREATED_AT: 0.0, Columns.GENERATED_AT: 0.0, Columns.SCORED_AT: 0.0}])


def header(kind: str, v: int = WIRE_VERSION) -> bytes:
    return pack({"kind": kind, "v": v, "sender": "fuzzer", "seq": 0})


def confusing_value(rng: random.Random):
    """A msgpack value of a shape or type no honest field holds (or holds elsewhere)."""
    n = rng.choice([2, 17, 300, 5000])
    return rng.choice([
        lambda: [[]] * n, lambda: {str(i): i for i in range(n)}, lambda: "x" * (n * 10), lambda: b"\1" * (n * 10),
        lambda: [rng.randrange(-2**31, 2**31) for _ in range(n)], lambda: None, lambda: True, lambda: -1,
        lambda: 2**64 - 1, lambda: float("nan"), lambda: float("-inf"), lambda: [[[["deep"]]]],
        lambda: {"a": {"b": []}},
    ])()


class FrameMaker:
    """Bad frames for an endpoint of one kind, in every class, from a seeded generator."""

    def __init__(self, kind: Kind, bodies: dict[Kind, bytes], count: int, seed: int):
        self.kind, self.bodies, self.rng = kind, bodies, random.Random(seed)
        self.valid = FrameCounter("fuzzer").frame(kind, bodies[kind])
        other = next(k for k in bodies if k != kind)
        self.wrong_kind = FrameCounter("fuzzer").frame(other, bodies[other])
        limit = FRAME_LIMITS[kind]
        self.padding = memoryview(b"\0" * (limit + 1))
        self.oversized_left = max(2, min(count // 10, OVERSIZED_BYTES // limit))

    def make(self) -> list:
        rng, (head, body) = self.rng, self.valid
        choice = rng.randrange(11)
        if choice >= 9 and self.oversized_left:
            self.oversized_left -= 1
            if choice == 9:
                return [head, self.padding]
            half = len(self.padding) // 2 + 1  # each part under the limit, together over it
            return [head, self.padding[:half], self.padding[:half]]
        if choice == 0:
            return [rng.randbytes(rng.randrange(65)), rng.randbytes(rng.randrange(257))]
        if choice == 1:
            return [head, rng.randbytes(rng.randrange(1, 2049))]
        if choice == 2:
            return [head[:rng.randrange(len(head))], body]
        if choice == 3:  # cut into the body (an Arrow stream keeps its last 8 bytes: the end marker)
            return [head, body[:rng.randrange(max(1, len(body) - 8))]]
        if choice == 4:  # another version, or one equal to it of another type (True == 1.0 == 1)
            return [header(self.kind.value, v=rng.choice([WIRE_VERSION + 1 + rng.randrange(5), True, 1.0])), body]
        if choice == 5:
            return [header("telepathy"), body]
        if choice == 6:
            return list(self.wrong_kind)
        if choice == 7:
            return rng.choice([[head], [head, body, body], []])
        return [head, self.confused()]

    def confused(self) -> bytes:
        """A body of this kind's fields in the wrong shapes or types (msgpack where Arrow belongs), checked to be
        refused by the kind's own decoder: a frame that would pass is no bad frame."""
        for _ in range(20):
            if self.kind in (Kind.EPISODES, Kind.BATCH):
                body = pack({name: confusing_value(self.rng) for name in (Columns.EPISODE_ID, Columns.PROMPT_IDS)})
            else:
                fields = unpack(self.bodies[self.kind])
                mutation = self.rng.randrange(4)
                if mutation == 0:
                    fields[self.rng.choice(sorted(fields))] = confusing_value(self.rng)
                elif mutation == 1:
                    del fields[self.rng.choice(sorted(fields))]
                elif mutation == 2:
                    fields["extra"] = confusing_value(self.rng)
                else:
                    fields = confusing_value(self.rng)
                body = pack(fields)
            try:
                DECODERS[self.kind](body)
            except Exception:  # noqa: BLE001 - refused, however: what this class is for
                return body
        return pack([])


def endpoint_count(stats: dict) -> int:
    """Frames an endpoint has accounted for: rejected by its link, repeated, or handed to its inbox."""
    return stats["dropped"] + stats["duplicates"] + stats["received"]


def wait_until(predicate, timeout: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.002)
    return False


class Fuzzer:
    def __init__(self, frames: int, state_dir: str):
        self.frames, self.cluster, self.ctx = frames, LocalCluster(transport="zmq"), zmq.Context.instance()
        self.state_dir = state_dir
        self.bodies = example_bodies()
        self.publisher = self.ctx.socket(zmq.PUB)
        self.publisher.setsockopt(zmq.SNDHWM, 0)
        self.pub_address = f"tcp://127.0.0.1:{self.publisher.bind_to_random_port('tcp://127.0.0.1')}"
        self.results: list[dict] = []

    def spawn(self, model: str) -> dict:
        c = self.cluster
        learner = c.spawn("learner", LearnerActor, LearnerConfig(model_path=model), peers={})
        replay = c.spawn("replay", ReplayActor, ReplayConfig(batch_episodes=1, capacity_episodes=4),
                         peers={"learner": [learner["batches"]]})
        reward = c.spawn("reward", RewardActor, RewardConfig(), peers={"replay": [replay["episodes"]]})
        league = c.spawn("league", LeagueActor, LeagueConfig(members=[{"id": "main", "role": "main"}],
                                                             state_dir=self.state_dir), peers={})
        rollout = c.spawn("rollout", RolloutActor, RolloutConfig(model_path=model),
                          peers={"weights": [self.pub_address]})
        env = c.spawn("env", EnvActor, EnvConfig(tokenizer_path=model),
                      peers={"rollout": [SINK], "reward": [SINK], "versions": [self.pub_address]})
        return {"learner": learner, "replay": replay, "reward": reward, "league": league, "rollout": rollout,
                "env": env}

    def stats(self, actor: str, stream: str) -> dict | None:
        try:
            return self.cluster.statistics(actor)["streams"][stream]
        except Exception:  # the loop has died: a crash
            return None

    def fuzz_link(self, actor: str, stream: str, address: str, kind: Kind, capacity: int) -> dict:
        """A lossless endpoint: frames on a raw DEALER that speaks the link protocol, and breaks it too."""
        before = endpoint_count(self.stats(actor, stream))
        peer, stranger = self.ctx.socket(zmq.DEALER), self.ctx.socket(zmq.DEALER)
        maker, rng = FrameMaker(kind, self.bodies, self.frames, 1), random.Random(2)
        for sock in (peer, stranger):
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.connect(address)
        seq = 0
        for _ in range(self.frames):
            roll = rng.random()
            if roll < 0.05:
                peer.send_multipart([rng.randbytes(rng.choice([0, 15, 17])), b"body"], copy=False)  # no envelope
            elif roll < 0.10 and seq:
                peer.send_multipart([encode_link(LinkType.DATA, rng.randrange(seq)), b"again"])  # a repeat
            elif roll < 0.13 and seq:  # outside the window: `capacity` past the next the receiver expects, or far
                far = rng.choice([seq + capacity + rng.randrange(1000), 2**63, 2**64 - 1])
                frame = maker.make() if far < 2**63 else self.valid_or_bad(maker, rng)
                peer.send_multipart([encode_link(LinkType.DATA, far), *frame], copy=False)
            elif roll < 0.15:  # a stranger whose first sequence number is past any honest one
                first = rng.randrange(MAX_FIRST_SEQ, 2**64)
                stranger.send_multipart([encode_link(LinkType.DATA, first), *self.valid_or_bad(maker, rng)])
            else:
                peer.send_multipart([encode_link(LinkType.DATA, seq), *maker.make()], copy=False)
                seq += 1
        return self.settle(actor, stream, kind, before, [peer, stranger])

    @staticmethod
    def valid_or_bad(maker: FrameMaker, rng: random.Random) -> list:
        """Out of the window, even a valid frame is rejected (and never delivered)."""
        return list(maker.valid) if rng.random() < 0.5 else maker.make()

    def fuzz_subscription(self, actor: str, stream: str, topic: bytes, kind: Kind) -> dict:
        """A subscription may drop when full, so frames go a few at a time, each burst accounted first."""
        maker, probe = FrameMaker(kind, self.bodies, self.frames, 3), [topic, b"probe"]
        start = endpoint_count(self.stats(actor, stream))
        for _ in range(300):  # a probe every 0.1 s until the subscription takes effect
            self.publisher.send_multipart(probe)
            if wait_until(lambda: endpoint_count(self.stats(actor, stream)) > start, 0.1):
                break
        before = start
        while before != (before := endpoint_count(self.stats(actor, stream))):  # every probe sent has arrived
            time.sleep(0.3)
        for burst in range(0, self.frames, 3):
            size = min(3, self.frames - burst)
            for _ in range(size):
                self.publisher.send_multipart([topic, *maker.make()], copy=False)
            target = before + burst + size
            if not wait_until(lambda: (s := self.stats(actor, stream)) is None or endpoint_count(s) >= target, 30):
                break
        return self.settle(actor, stream, kind, before, [])

    def settle(self, actor: str, stream: str, kind: Kind, before: int, peers: list) -> dict:
        wait_until(lambda: (s := self.stats(actor, stream)) is None or endpoint_count(s) - before >= self.frames)
        for peer in peers:
            peer.close(0)
        after = self.stats(actor, stream)
        result = {"endpoint": f"{actor}.{stream}", "kind": kind.value, "sent": self.frames,
                  "accounted": None if after is None else endpoint_count(after) - before,
                  "crashed": after is None, "rejected": after and after.get("rejected"),
                  "repeated": after and after["duplicates"]}
        self.results.append(result)
        return result

    def still_serves(self) -> dict[str, bool]:
        """Each actor does its work on an honest message after the fuzzing (see the module)."""
        checks = {"rollout.manifest": self.rollout_skips_a_manifest_larger_than_its_model,
                  "rollout.min_version": self.rollout_refuses_a_version_beyond_the_announced,
                  "rollout": self.rollout_answers, "reward->replay->learner": self.episode_is_trained,
                  "learner.fetch": self.learner_serves_chunks, "league": self.league_assigns_and_records,
                  "env": self.env_counts_a_stray_completion}
        return {name: self.check(check) for name, check in checks.items()}

    @staticmethod
    def check(check) -> bool:
        try:
            return bool(check())
        except Exception as error:  # noqa: BLE001 - any failure here means an actor stopped serving
            print(f"fuzz: {check.__name__} failed: {error!r}", flush=True)
            return False

    def ask(self, address: str, kind: Kind, body: bytes, answer_kind: Kind, decode, reply_field: str | None):
        """Send ``body`` to ``address`` and wait for one answer on a receiver of our own (its address put in
        ``reply_field`` of the body's msgpack map), or for none when ``reply_field`` is None."""
        async def ask():
            transport = self.cluster.transport
            async with transport.open_receiver() as replies, transport.open_sender([address]) as out:
                message = body
                if reply_field is not None:
                    fields = unpack(body)
                    fields[reply_field] = replies.address
                    message = pack(fields)
                await Outbox(out, kind, "checker").send(message)
                if reply_field is None:
                    with trio.fail_after(30):
                        await out.drain()
                    return True
                with trio.fail_after(60):
                    return await Inbox(replies, answer_kind, decode).receive()
        return trio.run(ask)

    def rollout_skips_a_manifest_larger_than_its_model(self) -> bool:
        """A well-formed manifest of 1 TiB (in 16 MiB chunks): refused before anything is allocated, and counted
        (it once made a follower raise MemoryError and end the rollout)."""
        huge = WeightsManifest("main", 9, 2**40, MAX_CHUNK_BYTES, [0] * (2**40 // MAX_CHUNK_BYTES), "another-host",
                               "/nowhere", SINK)
        frames = FrameCounter("learner")

        def refused() -> bool:
            self.publisher.send_multipart([WEIGHTS_TOPIC + b"main", *frames.frame(Kind.WEIGHTS, huge.to_body())])
            return self.cluster.statistics("rollout")["weights"].get("too_large", 0) > 0

        return wait_until(refused, 30)

    def rollout_refuses_a_version_beyond_the_announced(self) -> bool:
        """One request for version 10**12 (its learner announced 9: the manifest above) is refused at once: it once
        stopped an hf rollout for every requester."""
        request = GenerationRequest(43, SINK, "main", [1, 2, 3], 1.0, 2, min_version=10**12).to_body()
        answer = self.ask(self.addresses["rollout"]["requests"], Kind.GENERATE, request, Kind.COMPLETION,
                          Completion.from_body, "reply_to")
        return answer.request_id == 43 and "beyond the newest version announced" in answer.error

    def rollout_answers(self) -> bool:
        request = GenerationRequest(42, SINK, "main", [1, 2, 3], 1.0, 2).to_body()
        answer = self.ask(self.addresses["rollout"]["requests"], Kind.GENERATE, request, Kind.COMPLETION,
                          Completion.from_body, "reply_to")
        return answer.request_id == 42 and not answer.error

    def episode_is_trained(self) -> bool:
        """Trained on, and the weights of the new version published."""
        def learner() -> tuple[int, int]:
            stats = self.cluster.statistics("learner")
            return stats["batches"], stats["weights"]["published"]

        trained, published = learner()
        self.ask(self.addresses["reward"]["episodes"], Kind.EPISODES, encode_table(honest_episode("fuzz-check")),
                 Kind.EPISODES, None, None)
        return wait_until(lambda: learner() == (trained + 1, published + 1), 120)

    def learner_serves_chunks(self) -> bool:
        version = self.cluster.statistics("learner")["version"]
        chunk = self.ask(self.addresses["learner"]["fetch"], Kind.WEIGHTS_FETCH,
                         WeightsFetch("main", version, 0, SINK).to_body(), Kind.WEIGHTS_CHUNK,
                         WeightsChunk.from_body, "reply_to")
        return chunk.version == version and len(chunk.data) > 0

    def league_assigns_and_records(self) -> bool:
        league = self.addresses["league"]
        match = self.ask(league["requests"], Kind.MATCH_REQUEST, MatchRequest(7, SINK, ["main"]).to_body(), Kind.MATCH,
                         MatchAssigned.from_body, "reply_to")
        results = self.cluster.statistics("league")["results"]
        result = MatchResult(match.match_id, match.learner, match.seats, [1.0] * len(match.seats))
        self.ask(league["results"], Kind.MATCH_RESULT, result.to_body(), Kind.MATCH_RESULT, None, None)
        return match.request_id == 7 and wait_until(
            lambda: self.cluster.statistics("league")["results"] == results + 1, 30)

    def env_counts_a_stray_completion(self) -> bool:
        strays = self.cluster.statistics("env")["duplicate_completions"]
        stray = Completion(2**50, [5], [-0.5], [0], True).to_body()  # no request of the env actor's has this id
        self.ask(self.addresses["env"]["completions"], Kind.COMPLETION, stray, Kind.COMPLETION, None, None)
        return wait_until(lambda: self.cluster.statistics("env")["duplicate_completions"] == strays + 1, 30)

    def run(self, model: str) -> dict:
        try:
            self.addresses = a = self.spawn(model)
            for actor, stream, address, kind, capacity in [
                ("learner", "batches", a["learner"]["batches"], Kind.BATCH, 1),
                ("learner", "fetch", a["learner"]["fetch"], Kind.WEIGHTS_FETCH, 64),
                ("replay", "episodes", a["replay"]["episodes"], Kind.EPISODES, 16),
                ("reward", "episodes", a["reward"]["episodes"], Kind.EPISODES, 16),
                ("league", "requests", a["league"]["requests"], Kind.MATCH_REQUEST, 256),
                ("league", "results", a["league"]["results"], Kind.MATCH_RESULT, 256),
                ("rollout", "requests", a["rollout"]["requests"], Kind.GENERATE, 1024),
                ("env", "completions", a["env"]["completions"], Kind.COMPLETION, 1024),
            ]:
                report(self.fuzz_link(actor, stream, address, kind, capacity))
            report(self.fuzz_subscription("rollout", "weights", WEIGHTS_TOPIC + b"main", Kind.WEIGHTS))
            report(self.fuzz_subscription("env", "versions", VERSION_TOPIC + b"main", Kind.VERSION))
            serving = self.still_serves()
        finally:
            self.cluster.shutdown()
            self.publisher.close(0)
        crashes = sum(r["crashed"] or r["accounted"] != r["sent"] for r in self.results) + (not all(serving.values()))
        return {"frames": sum(r["sent"] for r in self.results), "crashes": crashes, "serving": serving}


def report(result: dict) -> None:
    counts = {"repeated": result["repeated"] or 0, **(result["rejected"] or {})}
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()) if v)
    print(f"fuzz {result['endpoint']:>20} ({result['kind']}): {result['sent']} frames, "
          f"{result['accounted']} accounted for{' - CRASHED' if result['crashed'] else ''} [{reasons}]", flush=True)


def fuzz_live_actors(frames_per_endpoint: int) -> dict:
    """The fuzzer at ``frames_per_endpoint`` frames an endpoint, on the tiny model (made once in
    ~/.cache/tidal/models): each endpoint's accounts and whether every actor still serves printed, the verdict returned."""
    model = str(ensure_base_model("~/.cache/tidal/models", FUZZ_MODEL))
    with tempfile.TemporaryDirectory(prefix="tidal-fuzz-") as state_dir:
        result = Fuzzer(frames_per_endpoint, state_dir).run(model)
    failed = [name for name, ok in result["serving"].items() if not ok]
    print(f"fuzz: actors still serving: {not failed}" + (f" (not: {', '.join(failed)})" if failed else ""), flush=True)
    return result


def summary(result: dict) -> str:
    """The fuzzer's part of a last line: ``fuzz_frames=<n> fuzz_crashes=<n>``."""
    return " ".join([f"fuzz_frames={result['frames']}", f"fuzz_crashes={result['crashes']}"])
