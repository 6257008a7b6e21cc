"""Frames on the wire: `[header, body]`, the header a small msgpack map, the body Arrow IPC or msgpack.

A malformed frame raises FrameError; the receiving actor drops it and counts it, never executes it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import msgpack

WIRE_VERSION = 1
MAX_FRAME_BYTES = 256 * 2**20
# Received parts this large or larger arrive as read-only memoryviews (zero-copy), smaller ones as bytes.
ZERO_COPY_BYTES = 64 * 2**10

_UNPACK_LIMITS = dict(
    max_str_len=MAX_FRAME_BYTES,
    max_bin_len=MAX_FRAME_BYTES,
    max_array_len=2**24,
    max_map_len=2**20,
    max_ext_len=0,  # no extension types on the wire
)


class Kind(str, enum.Enum):
    """What a frame's body holds."""

    GENERATE = "generate"  # a generation request (msgpack)
    COMPLETION = "completion"  # a completion with behaviour log-probs and versions (msgpack)
    EPISODES = "episodes"  # finished episodes (Arrow IPC)
    BATCH = "batch"  # a training batch (Arrow IPC)
    WEIGHTS = "weights"  # versioned weights
    VERSION = "version"  # a policy-version announcement (msgpack)


@dataclass(frozen=True)
class Header:
    kind: Kind
    sender: str
    seq: int
    version: int = WIRE_VERSION


class FrameError(ValueError):
    """A frame that is malformed, too large, or of another wire version."""


def pack(obj) -> bytes:
    """msgpack for small control bodies (str stays str, bytes stays bytes)."""
    return msgpack.packb(obj, use_bin_type=True)


def unpack(buf):
    """Inverse of `pack`, with size limits; map keys must be str or bytes. Raises FrameError."""
    try:
        return msgpack.unpackb(buf, raw=False, **_UNPACK_LIMITS)
    except (ValueError, TypeError, msgpack.UnpackException) as error:
        raise FrameError(f"body is not valid msgpack: {error!r}") from error


def encode_frame(kind: Kind, body: bytes, sender: str, seq: int) -> list[bytes]:
    kind = Kind(kind)
    if len(body) > MAX_FRAME_BYTES:
        raise FrameError(f"frame body of {len(body)} bytes exceeds the limit of {MAX_FRAME_BYTES}")
    header = pack({"kind": kind.value, "v": WIRE_VERSION, "sender": sender, "seq": seq})
    return [header, body]


def decode_frame(parts: list) -> tuple[Header, memoryview | bytes]:
    """Check a received frame and split it into its header and body (not copied)."""
    if len(parts) != 2:
        raise FrameError(f"frame has {len(parts)} parts, expected 2 (header, body)")
    size = sum(len(part) for part in parts)
    if size > MAX_FRAME_BYTES:
        raise FrameError(f"frame of {size} bytes exceeds the limit of {MAX_FRAME_BYTES}")
    try:
        fields = unpack(parts[0])
    except FrameError as error:
        raise FrameError(f"header is not msgpack: {error}") from None
    return _header(fields), _as_buffer(parts[1])


def _header(fields) -> Header:
    if not isinstance(fields, dict):
        raise FrameError(f"header is a {type(fields).__name__}, expected a map")
    version = fields.get("v")
    if version != WIRE_VERSION:
        raise FrameError(f"wire version {version!r}, expected {WIRE_VERSION}")
    try:
        kind = Kind(fields.get("kind"))
    except ValueError:
        raise FrameError(f"unknown frame kind {fields.get('kind')!r}") from None
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
