"""Weights manifests bounded by what a learner could publish, a follower that no manifest can end, and a wire
version that is the integer 1, not something equal to it (the review's old 19 and new findings on manifests)."""

import pytest
import trio

from streams.messages import MAX_CHUNK_BYTES, WeightsManifest
from streams.weights import WeightsFollower
from streams.wire import WIRE_VERSION, FrameError, Kind, decode_frame, encode_frame, pack, unpack

SINK = "tcp://127.0.0.1:9"


def manifest(size: int, chunk_bytes: int, chunks: int | None = None, host: str = "another-host") -> WeightsManifest:
    count = -(-size // chunk_bytes) if chunks is None else chunks
    return WeightsManifest("main", 3, size, chunk_bytes, [0] * count, host, "/nowhere", SINK)


@pytest.mark.parametrize("v", [True, 1.0, "1", None])
def test_only_the_integer_wire_version_passes(v):
    header, body = encode_frame(Kind.VERSION, b"\x80", "learner", 0)
    assert decode_frame([header, body])[0].version == WIRE_VERSION
    fields = unpack(header)
    fields["v"] = v
    with pytest.raises(FrameError) as refused:
        decode_frame([pack(fields), body])
    assert refused.value.reason == "wrong_version"


def test_a_manifest_whose_chunks_no_chunk_message_could_carry_is_refused():
    """The review's manifest: 2**62 bytes in 4 chunks of 2**60, which decoded and made a follower allocate it."""
    with pytest.raises(FrameError, match="chunks of"):
        WeightsManifest.from_body(manifest(2**62, 2**60).to_body())
    with pytest.raises(FrameError, match="chunks of"):
        WeightsManifest.from_body(manifest(10, MAX_CHUNK_BYTES + 1).to_body())
    with pytest.raises(FrameError, match="does not match"):  # more bytes than its checksums cover
        WeightsManifest.from_body(manifest(10 * MAX_CHUNK_BYTES, MAX_CHUNK_BYTES, chunks=4).to_body())
    honest = manifest(5 * MAX_CHUNK_BYTES - 1, MAX_CHUNK_BYTES)
    assert WeightsManifest.from_body(honest.to_body()) == honest


class FailingTransport:
    """A transport whose every stream fails to open, as memory or sockets run out."""

    def __init__(self, error: BaseException):
        self.error = error

    def check_peer_address(self, address):
        pass  # any address: what fails is the stream

    def open_receiver(self, *args, **kwargs):
        raise self.error


def test_a_follower_refuses_a_manifest_larger_than_its_model_and_survives_any_failure_to_fetch():
    async def test():
        bounded = WeightsFollower(FailingTransport(AssertionError("opened a stream")), max_bytes=1000)
        assert await bounded.fetch(manifest(2**40, MAX_CHUNK_BYTES)) is None  # nothing allocated, nothing opened
        assert bounded.stats["too_large"] == 1 and bounded.stats["fetch_failed"] == 0
        for error in (MemoryError(), OSError("too many open files")):
            follower = WeightsFollower(FailingTransport(error))
            assert await follower.fetch(manifest(1000, 100)) is None
            assert follower.stats["fetch_failed"] == 1

    trio.run(test)


def test_a_manifest_naming_a_chunk_server_that_is_no_stream_of_the_run_is_refused(tmp_path):
    """A manifest names where its chunks are served; the follower connects there only where a reply may go
    (`ZmqTransport.check_peer_address`): on one host, a socket of the run's own directory, never a local port."""
    from streams.channels import ZmqTransport

    run_dir = tmp_path / "streams"
    run_dir.mkdir(mode=0o700)
    follower = WeightsFollower(ZmqTransport(ipc_dir=str(run_dir)))
    assert trio.run(follower.fetch, manifest(1000, 100)) is None  # its chunks at tcp://127.0.0.1:9
    assert follower.stats["bad_address"] == 1 and follower.stats["from_chunks"] == 0
