import msgpack
import pytest

from streams import wire
from streams.wire import (
    WIRE_VERSION,
    FrameCounter,
    FrameError,
    Header,
    Kind,
    decode_frame,
    encode_frame,
    pack,
    unpack,
)


def header(**fields) -> bytes:
    values = {"kind": "episodes", "v": WIRE_VERSION, "sender": "env-0", "seq": 3}
    values.update(fields)
    return msgpack.packb(values)


def test_frame_round_trip():
    parts = encode_frame(Kind.EPISODES, b"arrow bytes", sender="env-0", seq=3)
    assert decode_frame(parts) == (Header(Kind.EPISODES, "env-0", 3), b"arrow bytes")


def test_body_comes_back_as_a_buffer_without_copy():
    body = memoryview(b"x" * 100)
    _, got = decode_frame([header(), body])
    assert got is body


def test_counter_stamps_sequence_numbers():
    counter = FrameCounter("learner")
    headers = [decode_frame(counter.frame(Kind.VERSION, pack({"version": v})))[0] for v in range(3)]
    assert [(h.sender, h.seq, h.kind) for h in headers] == [("learner", s, Kind.VERSION) for s in range(3)]


def test_pack_round_trip():
    obj = {"prompt": [1, 2, 3], "text": "héllo", "blob": b"\x00\x01", "nested": {"t": 0.5}}
    assert unpack(pack(obj)) == obj


@pytest.mark.parametrize(
    "parts, message",
    [
        ([header()], "1 parts, expected 2"),
        ([header(), b"", b""], "3 parts, expected 2"),
        ([b"\xc1", b""], "header is not msgpack"),
        ([msgpack.packb([1, 2]), b""], "header is a list, expected a map"),
        ([header(kind="telepathy"), b""], "unknown frame kind 'telepathy'"),
        ([header(kind=["x"]), b""], "unknown frame kind"),
        ([header(v=2), b""], "wire version 2, expected 1"),
        ([header(seq="3"), b""], "int seq"),
    ],
)
def test_malformed_frames_are_named(parts, message):
    with pytest.raises(FrameError, match=message):
        decode_frame(parts)


def test_oversized_frames_are_rejected(monkeypatch):
    monkeypatch.setattr(wire, "MAX_FRAME_BYTES", 100)
    with pytest.raises(FrameError, match="exceeds the limit of 100") as error:
        decode_frame([header(), b"x" * 100])
    assert error.value.reason == "oversized"
    monkeypatch.setitem(wire.FRAME_LIMITS, Kind.BATCH, 100)
    with pytest.raises(FrameError, match="exceeds the limit of 100"):
        encode_frame(Kind.BATCH, b"x" * 101, "replay", 0)


def test_each_kind_has_its_own_size_limit():
    small = wire.FRAME_LIMITS[Kind.VERSION]
    with pytest.raises(FrameError, match=f"version frame of .* exceeds the limit of {small}") as error:
        decode_frame([header(kind="version"), b"x" * small])
    assert error.value.reason == "oversized"
    decode_frame([header(kind="episodes"), b"x" * small])  # within the episodes limit


BAD_MSGPACK = [b"\xc1", b"\x92\x01", msgpack.packb(msgpack.ExtType(1, b"x")), b"\x81\x01\x02"]


@pytest.mark.parametrize("buf", BAD_MSGPACK, ids=["unused-byte", "truncated", "ext-type", "int-key"])
def test_unpack_wraps_msgpack_errors(buf):
    with pytest.raises(FrameError):
        unpack(buf)
