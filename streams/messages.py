"""The control messages of the data plane, as dataclasses with their msgpack bodies.

Token ids, log-probs and versions travel as raw little-endian arrays inside msgpack (PLATFORM.md: about
6x faster than msgpack lists). Field names are declared here once; actors never build these maps by hand.
Each message is unpacked within its own `wire.Shape` (``SHAPE``: the longest bytes, string, array and map an
honest one holds), so a body of the right kind but the wrong shape is refused before it is built.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from streams.generation_messages import (  # noqa: F401 (imported from here, as the other messages are)
    MAX_BATCH, Completion, GenerationRequest, Packed, decode_completions, decode_requests, encode_completions,
    encode_requests, packed_bytes, split_completions, split_requests)
from streams.message_fields import _address, _fields
from streams.wire import FrameError, Shape, pack
MAX_SEATS = 16  # the most seats (players) a match may have
MAX_CHUNK_BYTES = 16 * 2**20  # the largest weights chunk a message carries (the learner's are 8 MiB)
WEIGHTS_TOPIC = b"weights/"
VERSION_TOPIC = b"version/"
DROPPED_TOPIC = b"dropped/"


def dropped_topic(source: str) -> bytes:
    """The topic of ``source``'s drop notices (an env actor's name): closed by a slash, so that ``env-1`` does not
    subscribe to ``env-10``'s too (topics match by prefix)."""
    return DROPPED_TOPIC + source.encode() + b"/"


@dataclass
class WeightsManifest:
    """Version ``version`` of a policy's parameters (safetensors, ``size`` bytes) is published.

    The bytes are in the file ``path`` on the host ``host`` (shared memory: one write, many readers), and
    in chunks of ``chunk_bytes`` from the learner at ``fetch_from`` (``WeightsFetch``) for other hosts.
    ``chunk_crcs`` holds the CRC-32C of every chunk: a reader checks every byte, however it got them.
    ``life``: the learner's life that trained it (`VersionAnnounced`), so a follower that missed the announcement
    before it still tells a restarted learner's versions from its predecessor's.

    ``size`` is bounded by what a learner could publish: as many chunks as it has checksums (``SHAPE``: 256 Ki),
    each at most ``MAX_CHUNK_BYTES`` (a `WeightsChunk` carries no more), so at most 4 TiB; a follower bounds it
    further by its own model (`streams.weights.WeightsFollower`'s ``max_bytes``). A manifest of 2**62 bytes in
    chunks of 2**60 once decoded, and made a follower allocate what it claimed.
    """

    policy_id: str
    version: int
    size: int
    chunk_bytes: int
    chunk_crcs: list[int]
    host: str
    path: str
    fetch_from: str
    life: int = 0

    NAMES = ("policy", "version", "size", "chunk_bytes", "crcs", "host", "path", "fetch", "life")
    SHAPE = Shape(bin_len=2**20)  # 4 bytes a chunk: 256 Ki chunks, 2 TiB of weights in chunks of 8 MiB

    def to_body(self) -> bytes:
        crcs = np.asarray(self.chunk_crcs, dtype="<u4").tobytes()
        values = (self.policy_id, self.version, self.size, self.chunk_bytes, crcs, self.host, self.path,
                  self.fetch_from, self.life)
        return pack(dict(zip(self.NAMES, values)))

    @classmethod
    def from_body(cls, body) -> WeightsManifest:
        f = _fields(body, cls.NAMES, "weights manifest", (str, int, int, int, bytes, str, str, str, int), cls.SHAPE)
        crcs = np.frombuffer(f["crcs"], dtype="<u4").tolist() if len(f["crcs"]) % 4 == 0 else None
        if not 0 < f["chunk_bytes"] <= MAX_CHUNK_BYTES:
            raise FrameError(f"weights manifest in chunks of {f['chunk_bytes']} bytes, outside (0, {MAX_CHUNK_BYTES}]")
        if f["size"] < 0 or crcs is None or len(crcs) != -(-f["size"] // f["chunk_bytes"]):
            raise FrameError(f"weights manifest of {f['size']} bytes in chunks of {f['chunk_bytes']} does not "
                             f"match its {len(f['crcs']) / 4:g} checksums")
        if f["life"] < 0:
            raise FrameError(f"weights manifest with a negative life {f['life']}")
        return cls(f["policy"], f["version"], f["size"], f["chunk_bytes"], crcs, f["host"], f["path"],
                   _address(f["fetch"], "weights manifest"), f["life"])

    @property
    def chunks(self) -> int:
        return len(self.chunk_crcs)


@dataclass
class WeightsFetch:
    """Send chunk ``index`` of version ``version`` to ``reply_to``."""

    policy_id: str
    version: int
    index: int
    reply_to: str

    NAMES = ("policy", "version", "index", "reply_to")
    SHAPE = Shape()

    def to_body(self) -> bytes:
        return pack(dict(zip(self.NAMES, (self.policy_id, self.version, self.index, self.reply_to))))

    @classmethod
    def from_body(cls, body) -> WeightsFetch:
        f = _fields(body, cls.NAMES, "weights fetch", (str, int, int, str), cls.SHAPE)
        return cls(f["policy"], f["version"], f["index"], _address(f["reply_to"], "weights fetch"))


@dataclass
class WeightsChunk:
    """Chunk ``index`` of a version; empty when the learner no longer has that version."""

    policy_id: str
    version: int
    index: int
    data: bytes

    NAMES = ("policy", "version", "index", "data")
    SHAPE = Shape(bin_len=MAX_CHUNK_BYTES)  # a chunk

    def to_body(self) -> bytes:
        return pack(dict(zip(self.NAMES, (self.policy_id, self.version, self.index, self.data))))

    @classmethod
    def from_body(cls, body) -> WeightsChunk:
        f = _fields(body, cls.NAMES, "weights chunk", (str, int, int, bytes), cls.SHAPE)
        return cls(f["policy"], f["version"], f["index"], f["data"])


@dataclass
class VersionAnnounced:
    """The learner of ``policy_id`` is now at ``version``, in its ``life``: its starts in this life of the run,
    0 the first. A restarted learner (from an older checkpoint) announces lower versions in a higher life, and
    its followers take them: the versions of a dead life are nobody's any more. ``eta``: the staleness bound
    admission holds to from now on (actors/learner/staleness.py)."""

    policy_id: str
    version: int
    life: int = 0
    eta: int = -1  # the staleness bound this version goes out with (-1: not said; the configured one holds)

    NAMES = ("policy", "version", "life", "eta")
    SHAPE = Shape()

    def to_body(self) -> bytes:
        return pack(dict(zip(self.NAMES, (self.policy_id, self.version, self.life, self.eta))))

    @classmethod
    def from_body(cls, body) -> VersionAnnounced:
        f = _fields(body, cls.NAMES, "version", (str, int, int, int), cls.SHAPE)
        if f["life"] < 0:
            raise FrameError(f"version message with a negative life {f['life']}")
        if not -1 <= f["eta"] <= 1_000_000:
            raise FrameError(f"version message with a staleness bound {f['eta']} outside [-1, 1000000]")
        return cls(f["policy"], f["version"], f["life"], f["eta"])


@dataclass
class EpisodeDropped:
    """Episode ``episode_id`` of learning member ``policy_id``, delivered by its env actor, will never be trained
    on: the reward actor or replay dropped it, for ``reason`` (``unscored``, ``rejected_by_reward``,
    ``rejected_by_replay``, ``refused_by_replay``). Its env actor gives its admission back
    (actors/env/admission.py); sent on the topic ``dropped_topic(<env actor>)``."""

    policy_id: str
    episode_id: str
    reason: str

    NAMES = ("policy", "episode", "reason")
    SHAPE = Shape(str_len=1024)

    def to_body(self) -> bytes:
        return pack(dict(zip(self.NAMES, (self.policy_id, self.episode_id, self.reason))))

    @classmethod
    def from_body(cls, body) -> EpisodeDropped:
        f = _fields(body, cls.NAMES, "dropped", (str, str, str), cls.SHAPE)
        return cls(f["policy"], f["episode"], f["reason"])


@dataclass
class ScaleRequest:
    """Run ``count`` actors of kind ``actor`` (``tidal scale rollout=4``)."""

    actor: str
    count: int

    NAMES = ("actor", "count")
    SHAPE = Shape()

    def to_body(self) -> bytes:
        return pack(dict(zip(self.NAMES, (self.actor, self.count))))

    @classmethod
    def from_body(cls, body) -> ScaleRequest:
        f = _fields(body, cls.NAMES, "scale", (str, int), cls.SHAPE)
        return cls(f["actor"], f["count"])


@dataclass
class StopRequest:
    """End the run (``tidal stop``): training stops at its next round; ``evaluate``: the final evaluation runs
    first, as at the end of its budget (else it ends as on Ctrl-C)."""

    evaluate: bool

    NAMES = ("evaluate",)
    SHAPE = Shape()

    def to_body(self) -> bytes:
        return pack({"evaluate": self.evaluate})

    @classmethod
    def from_body(cls, body) -> StopRequest:
        return cls(_fields(body, cls.NAMES, "stop", (bool,), cls.SHAPE)["evaluate"])


@dataclass
class ScaleAnswered:
    """The run took a ``ScaleRequest`` (``ok``), or why not; ``actors``: how many of that kind it ran when asked."""

    ok: bool
    message: str
    actors: int = 0

    NAMES = ("ok", "message", "actors")
    SHAPE = Shape()

    def to_body(self) -> bytes:
        return pack(dict(zip(self.NAMES, (self.ok, self.message, self.actors))))

    @classmethod
    def from_body(cls, body) -> ScaleAnswered:
        f = _fields(body, cls.NAMES, "scale answer", (bool, str, int), cls.SHAPE)
        return cls(f["ok"], f["message"], f["actors"])
def _names(value, what: str, field_name: str) -> list[str]:
    """A non-empty list of short policy or opponent names, at most MAX_SEATS of them."""
    if not isinstance(value, list) or len(value) > MAX_SEATS or \
            any(not isinstance(v, str) or not 0 < len(v) <= 128 for v in value):
        raise FrameError(f"{what} message field {field_name} is not a list of at most {MAX_SEATS} names")
    return value


@dataclass
class MatchRequest:
    """An env actor wants a league match for one of the learning members in ``open_members`` (those it may
    start a training episode for now: admission); reply to ``reply_to``."""

    request_id: int
    reply_to: str
    open_members: list[str]

    NAMES = ("id", "reply_to", "open")
    SHAPE = Shape(array_len=MAX_SEATS)

    def to_body(self) -> bytes:
        return pack(dict(zip(self.NAMES, (self.request_id, self.reply_to, self.open_members))))

    @classmethod
    def from_body(cls, body) -> MatchRequest:
        f = _fields(body, cls.NAMES, "match request", (int, str), cls.SHAPE)
        return cls(f["id"], _address(f["reply_to"], "match request"), _names(f["open"], "match request", "open"))


@dataclass
class MatchAssigned:
    """Match ``match_id`` for request ``request_id``: ``seats[s]`` is a learning member (live weights), a frozen
    snapshot or a fixed opponent; the seats held by ``learner`` are trained on, the others only play."""

    request_id: int
    match_id: int
    learner: str
    seats: list[str]

    NAMES = ("id", "match", "learner", "seats")
    SHAPE = Shape(array_len=MAX_SEATS)

    def to_body(self) -> bytes:
        return pack(dict(zip(self.NAMES, (self.request_id, self.match_id, self.learner, self.seats))))

    @classmethod
    def from_body(cls, body) -> MatchAssigned:
        f = _fields(body, cls.NAMES, "match", (int, int, str), cls.SHAPE)
        seats = _names(f["seats"], "match", "seats")
        if f["learner"] not in seats:
            raise FrameError(f"match {f['match']}: its learner {f['learner']!r} holds no seat")
        return cls(f["id"], f["match"], f["learner"], seats)


@dataclass
class MatchResult:
    """How match ``match_id`` ended: every seat's return (``errored``: it did not finish, nothing to rate)."""

    match_id: int
    learner: str
    seats: list[str]
    returns: list[float]
    errored: bool = False

    NAMES = ("match", "learner", "seats", "returns", "errored")
    SHAPE = Shape(array_len=MAX_SEATS)

    def to_body(self) -> bytes:
        values = (self.match_id, self.learner, self.seats, [float(r) for r in self.returns], self.errored)
        return pack(dict(zip(self.NAMES, values)))

    @classmethod
    def from_body(cls, body) -> MatchResult:
        f = _fields(body, cls.NAMES, "match result", (int, str), cls.SHAPE)
        seats = _names(f["seats"], "match result", "seats")
        returns = f["returns"]
        if not isinstance(returns, list) or len(returns) != len(seats) or \
                any(isinstance(r, bool) or not isinstance(r, (int, float)) for r in returns):
            raise FrameError(f"match result {f['match']}: returns are not one number per seat")
        if not isinstance(f["errored"], bool):
            raise FrameError("match result message field errored is not a bool")
        return cls(f["match"], f["learner"], seats, [float(r) for r in returns], f["errored"])
