"""Frames on the wire: `[header, body]`, the header a small msgpack map, the body Arrow IPC or msgpack.

A malformed, oversized, unknown-kind or wrong-version frame raises FrameError (its `reason` says which);
the receiving actor drops it, logs it and counts it, never executes it, and nothing is ever unpickled.

Below the frames, a lossless ZeroMQ link wraps each message in a fixed-size envelope (`encode_link`):
the link's sequence number, or an acknowledgement that returns credit (see `zmq_channels`).
"""

from __future__ import annotations

import enum
import logging
import struct
from collections import Counter
from dataclasses import dataclass

import msgpack

log = logging.getLogger(__name__)

WIRE_VERSION = 1
MAX_FRAME_BYTES = 256 * 2**20  # the largest frame of any kind; sockets disconnect a peer that sends more
# Received parts this large or larger arrive as read-only memoryviews (zero-copy), smaller ones as bytes.
ZERO_COPY_BYTES = 64 * 2**10
# a send or receive that never has to wait yields to other tasks once every this many calls (yielding on every
# message halves the throughput): ZeroMQ's sockets and the in-memory channels alike
YIELD_EVERY = 16
MAX_HEADER_BYTES = 1024
MAX_PROMPT_TOKENS = 2**18  # the longest prompt a generation request may carry
MAX_NEW_TOKENS = 2**16  # the most tokens a generation request may ask for (and a completion carry)


@dataclass(frozen=True)
class Shape:
    """The largest msgpack values a body may hold: bytes, string, array and map lengths.

    A body of a kind is unpacked with its kind's shape (`messages`): a longer value refuses it at once, before
    anything is built, so a body cannot make a receiver build millions of objects (an array of 4 M empty arrays
    in 4 MiB took 4 s to unpack).
    """

    bin_len: int = 0
    str_len: int = 4096
    array_len: int = 0
    map_len: int = 16

    def unpack_args(self) -> dict:
        return dict(max_bin_len=self.bin_len, max_str_len=self.str_len, max_array_len=self.array_len,
                    max_map_len=self.map_len, max_ext_len=0)  # no extension types on the wire


ANY_SHAPE = Shape(MAX_FRAME_BYTES, MAX_FRAME_BYTES, 2**24, 2**20)  # what `unpack` allows when not told a shape
HEADER_SHAPE = Shape(str_len=256, array_len=8, map_len=8)  # within MAX_HEADER_BYTES anyway


class Kind(str, enum.Enum):
    """What a frame's body holds."""

    GENERATE = "generate"  # a generation request (msgpack)
    COMPLETION = "completion"  # a completion with behaviour log-probs and versions (msgpack)
    EPISODES = "episodes"  # finished episodes (Arrow IPC)
    BATCH = "batch"  # a training batch (Arrow IPC)
    WEIGHTS = "weights"  # versioned weights
    VERSION = "version"  # a policy-version announcement (msgpack)
    WEIGHTS_FETCH = "weights_fetch"  # a request for chunks of a published version (msgpack)
    WEIGHTS_CHUNK = "weights_chunk"  # one checksummed chunk of a published version (msgpack)
    SCALE = "scale"  # a command to a running run: how many actors of a kind (msgpack)
    SCALED = "scaled"  # the run's answer to it, or to a stop (msgpack)
    STOP = "stop"  # a command to a running run: end it as its budget would, or at once (msgpack)
    MATCH_REQUEST = "match_request"  # an env actor asks the league for a match (msgpack)
    MATCH = "match"  # the league's answer: who sits in which seat (msgpack)
    MATCH_RESULT = "match_result"  # a finished league match: seats and returns (msgpack)
    DROPPED = "dropped"  # a delivered episode that will never be trained on, and why (msgpack)


_KINDS: dict[str, Kind] = {kind.value: kind for kind in Kind}  # a look-up, not an enum call, per frame

# The largest frame of each kind, header and body together: a receiver drops (and counts) a larger one before
# decoding its body. Each is sized from what an honest frame of the kind needs.
FRAME_LIMITS: dict[Kind, int] = {
    Kind.GENERATE: 4 * MAX_PROMPT_TOKENS + 64 * 2**10,  # the prompt's token ids and a few short fields
    Kind.COMPLETION: 12 * MAX_NEW_TOKENS + 64 * 2**10,  # ids, log-probs and versions of every new token
    Kind.EPISODES: 64 * 2**20,
    Kind.BATCH: MAX_FRAME_BYTES,
    Kind.WEIGHTS: 4 * 2**20,  # a manifest: the bytes go by shared memory or in chunks
    Kind.VERSION: 64 * 2**10,
    Kind.WEIGHTS_FETCH: 64 * 2**10,
    Kind.WEIGHTS_CHUNK: 17 * 2**20,  # a chunk of at most 16 MiB and its fields
    Kind.SCALE: 4 * 2**10,
    Kind.SCALED: 64 * 2**10,
    Kind.STOP: 4 * 2**10,
    Kind.MATCH_REQUEST: 64 * 2**10,
    Kind.MATCH: 64 * 2**10,
    Kind.MATCH_RESULT: 64 * 2**10,
    Kind.DROPPED: 4 * 2**10,
}


@dataclass(frozen=True)
class Header:
    kind: Kind
    sender: str
    seq: int
    version: int = WIRE_VERSION


class FrameError(ValueError):
    """A frame that is malformed, too large, of an unknown kind or of another wire version.

    `reason` is the counter it is dropped under: malformed, oversized, unknown_kind, wrong_version, wrong_kind,
    bad_body (the body does not decode), and below the frames (`zmq_receiver`) bad_link (not a link envelope, or
    one of the wrong type), out_of_window (a sequence number outside the acknowledgement window) and
    receive_error (any other failure while taking a message in).
    """

    def __init__(self, message: str, reason: str = "malformed"):
        super().__init__(message)
        self.reason = reason


def _short(error: BaseException, limit: int = 120) -> str:
    text = str(error)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


def pack(obj) -> bytes:
    """msgpack for small control bodies (str stays str, bytes stays bytes)."""
    return msgpack.packb(obj, use_bin_type=True)


def unpack(buf, shape: Shape = ANY_SHAPE):
    """Inverse of `pack`, within ``shape``'s limits; map keys must be str or bytes. Raises FrameError."""
    try:
        return msgpack.unpackb(buf, raw=False, **shape.unpack_args())
    except (ValueError, TypeError, RecursionError, msgpack.UnpackException) as error:
        # ExtraData's repr carries the whole unread remainder; name the error, not the bytes
        raise FrameError(f"body is not valid msgpack: {type(error).__name__}: {_short(error)}") from error


def encode_frame(kind: Kind, body: bytes, sender: str, seq: int) -> list[bytes]:
    kind = _KINDS[kind] if isinstance(kind, str) and kind in _KINDS else Kind(kind)  # Kind(...) names a bad one
    limit = FRAME_LIMITS[kind]
    header = pack({"kind": kind.value, "v": WIRE_VERSION, "sender": sender, "seq": seq})
    if len(header) + len(body) > limit:
        raise FrameError(f"{kind.value} frame of {len(header) + len(body)} bytes exceeds the limit of {limit}",
                         "oversized")
    return [header, body]


def decode_frame(parts: list) -> tuple[Header, memoryview | bytes]:
    """Check a received frame and split it into its header and body (not copied). Its size is every part's."""
    size = sum(len(part) for part in parts)
    if size > MAX_FRAME_BYTES:
        raise FrameError(f"frame of {len(parts)} parts and {size} bytes exceeds the limit of {MAX_FRAME_BYTES}",
                         "oversized")
    if len(parts) != 2:
        raise FrameError(f"frame has {len(parts)} parts, expected 2 (header, body)")
    if len(parts[0]) > MAX_HEADER_BYTES:
        raise FrameError(f"header of {len(parts[0])} bytes exceeds the limit of {MAX_HEADER_BYTES}", "oversized")
    try:
        fields = unpack(parts[0], HEADER_SHAPE)
    except FrameError as error:
        raise FrameError(f"header is not msgpack: {error}") from None
    header = _header(fields)
    if size > FRAME_LIMITS[header.kind]:
        raise FrameError(f"{header.kind.value} frame of {size} bytes exceeds the limit of "
                         f"{FRAME_LIMITS[header.kind]}", "oversized")
    return header, _as_buffer(parts[1])


def _header(fields) -> Header:
    if not isinstance(fields, dict):
        raise FrameError(f"header is a {type(fields).__name__}, expected a map")
    version = fields.get("v")
    if type(version) is not int or version != WIRE_VERSION:  # True and 1.0 equal 1, and are no wire version
        raise FrameError(f"wire version {version!r}, expected {WIRE_VERSION}", "wrong_version")
    try:
        kind = _KINDS[fields.get("kind")]
    except (KeyError, TypeError):  # TypeError: an unhashable value
        raise FrameError(f"unknown frame kind {fields.get('kind')!r}", "unknown_kind") from None
    sender, seq = fields.get("sender"), fields.get("seq")
    if not isinstance(sender, str) or not isinstance(seq, int) or isinstance(seq, bool):
        raise FrameError(f"header needs a str sender and an int seq, got {sender!r}, {seq!r}")
    return Header(kind=kind, sender=sender, seq=seq, version=version)


def _as_buffer(part) -> memoryview | bytes:
    return part if isinstance(part, (bytes, memoryview)) else memoryview(part)


class FrameCounter:
    """Stamps an endpoint's outgoing frames with its name and a sequence number (0, 1, 2, ...)."""

    def __init__(self, sender: str):
        self.sender = sender
        self.seq = 0

    def frame(self, kind: Kind, body: bytes) -> list[bytes]:
        parts = encode_frame(kind, body, self.sender, self.seq)
        self.seq += 1
        return parts


class DropLog:
    """Counts the frames an endpoint drops, by reason, and logs them: all of the first few, then every 1000th.

    A flood of bad frames is counted in full but cannot flood the log.
    """

    LOG_FIRST, LOG_EVERY = 5, 1000

    def __init__(self, where: str):
        self.where = where
        self.counts: Counter[str] = Counter()

    def drop(self, reason: str, detail: object) -> None:
        self.counts[reason] += 1
        n = self.counts[reason]
        if n <= self.LOG_FIRST or n % self.LOG_EVERY == 0:
            detail = str(detail)
            if len(detail) > 300:
                detail = detail[:300] + "..."
            log.warning("%s dropped a frame (%s, %d so far): %s", self.where, reason, n, detail)

    def total(self) -> int:
        return sum(self.counts.values())


class LinkType(enum.IntEnum):
    DATA = 1  # [envelope, *parts]: a message, numbered per link
    ACK = 2  # [envelope]: every message before `seq` was delivered; the receiver takes `window` unacknowledged


_LINK_TYPES = {int(kind): kind for kind in LinkType}
_LINK = struct.Struct("<4sBQI")  # magic, type, seq, window
LINK_MAGIC = b"tdl1"
LINK_BYTES = _LINK.size
# A link's first sequence number must be below this: no sender sends 2**62 messages, so no acknowledgement that
# follows (at most a window past the last message) can overflow the envelope's 64 bits.
MAX_FIRST_SEQ = 2**62


def encode_link(kind: LinkType, seq: int, window: int = 0) -> bytes:
    return _LINK.pack(LINK_MAGIC, kind, seq, window)


def decode_link(buf) -> tuple[LinkType, int, int]:
    """The (type, seq, window) of a link envelope; FrameError (reason ``bad_link``) if it is not one."""
    if len(buf) != _LINK.size:
        raise FrameError(f"link envelope of {len(buf)} bytes, expected {_LINK.size}", "bad_link")
    magic, kind, seq, window = _LINK.unpack(buf)
    if magic != LINK_MAGIC:
        raise FrameError(f"link envelope starts with {bytes(magic)!r}, expected {LINK_MAGIC!r}", "bad_link")
    link_type = _LINK_TYPES.get(kind)
    if link_type is None:
        raise FrameError(f"unknown link message type {kind}", "bad_link")
    return link_type, seq, window
