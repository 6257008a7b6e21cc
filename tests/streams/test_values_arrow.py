"""Arrow bodies are validated in full before anything reads them: exactly one uncompressed IPC stream a frame.

The frames here are the review's: a 3 KB episode whose middle list offset points 2 GB away (it passed reward and
replay, then crashed the learner in ``to_pylist``), a zstd-compressed body that expands a thousandfold, and two
streams (or trailing bytes) in one frame.
"""

import struct
import subprocess
import sys
import textwrap

import pyarrow as pa
import pytest

from streams.schema import Columns as C
from streams.schema import SchemaError, decode_batch, decode_table, encode_table, trajectory_table


def row(turn: int, prompt: int) -> dict:
    return {C.EPISODE_ID: "env-0-1", C.ENV_NAME: "t", C.SEED: 0, C.TURN: turn, C.AGENT: 0, C.MATCHUP: "main",
            C.POLICY_ID: "main", C.PROMPT_IDS: list(range(prompt)), C.ACTION_IDS: [1, 2], C.ACTION_TEXT: "",
            C.BEHAVIOUR_LOGPROBS: [-0.5, -0.5], C.POLICY_VERSIONS: [0, 0], C.REWARD: 0.0, C.TERMINATED: False,
            C.TRUNCATED: False, C.EPISODE_RETURN: 0.0, C.INVALID_ACTION: False, C.CREATED_AT: 0.0,
            C.GENERATED_AT: 0.0, C.SCORED_AT: 0.0}


def bad_middle_offset() -> bytes:
    """An honest three-turn episode whose prompt_ids offsets [0, 101, 304, 611] became [0, 101, 2**31 - 65536, 611]:
    the first and last offsets, which Arrow's light validation checks, are intact."""
    body = bytearray(encode_table(trajectory_table([row(0, 101), row(1, 203), row(2, 307)])))
    offsets = struct.pack("<4i", 0, 101, 304, 611)
    at = body.find(offsets)
    assert at >= 0 and body.find(offsets, at + 1) < 0
    body[at + 8:at + 12] = struct.pack("<i", 0x7FFF0000)
    return bytes(body)


def test_a_bad_middle_offset_is_refused_before_anything_reads_it():
    frame = bad_middle_offset()
    assert len(frame) < 6000
    with pytest.raises(SchemaError, match="invalid Arrow table.*[Oo]ffset"):
        decode_table(frame)
    with pytest.raises(SchemaError, match="[Oo]ffset"):
        decode_batch(frame)


def test_the_bad_offset_frame_crashes_a_reader_that_trusts_it():
    """The reproduction, in a child process: the frame passes Arrow's own reader, and reading it kills the process
    (what the learner did with it). Decoding it in-process above is safe because the decode refuses it first."""
    script = textwrap.dedent(f"""
        import pyarrow as pa
        table = pa.ipc.open_stream(pa.py_buffer({bad_middle_offset()!r})).read_all()
        print("read", table.num_rows, flush=True)
        table.column({C.PROMPT_IDS!r}).to_pylist()
    """)
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert "read 3" in child.stdout  # Arrow's reader took it ...
    assert child.returncode != 0  # ... and reading the column killed the process (SIGSEGV, or an error)


def compressed(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def test_a_compressed_body_is_refused_before_it_is_expanded():
    honest = compressed(trajectory_table([row(0, 8)]))
    with pytest.raises(SchemaError, match="compressed"):
        decode_table(honest)
    # a bomb: 8 MiB of zeros in a few KB; Arrow's own reader would expand it
    bomb = trajectory_table([row(0, 1)] * 4)
    bomb = bomb.set_column(bomb.schema.get_field_index(C.PROMPT_IDS), C.PROMPT_IDS,
                           pa.array([[0] * (2**19)] * 4, pa.list_(pa.int32())))
    frame = compressed(bomb)
    assert len(frame) < 64 * 1024
    assert pa.ipc.open_stream(pa.py_buffer(frame)).read_all().nbytes > 8 * 2**20
    with pytest.raises(SchemaError, match="compressed"):
        decode_table(frame)


@pytest.mark.parametrize("extra", [b"x", b"\0" * 8, None], ids=["a byte", "zeros", "a second stream"])
def test_one_stream_a_frame_and_nothing_after_it(extra):
    frame = encode_table(trajectory_table([row(0, 4)]))
    assert decode_table(frame).num_rows == 1
    with pytest.raises(SchemaError, match="after the IPC stream's end"):
        decode_table(frame + (frame if extra is None else extra))


def test_a_batch_number_still_travels_and_honest_tables_still_decode_without_copying():
    table = trajectory_table([row(0, 4), row(1, 5)])
    decoded, seq = decode_batch(encode_table(table, batch_seq=7))
    assert seq == 7 and decoded.to_pylist() == table.to_pylist()
    payload = encode_table(table)
    source = pa.py_buffer(payload)
    values = decode_table(payload).column(C.PROMPT_IDS).chunks[0].values.buffers()[1]
    assert source.address <= values.address < source.address + source.size


def test_the_parsed_trajectory_schema_is_reused_only_for_its_own_bytes():
    """A stream of exactly TRAJECTORY_SCHEMA skips parsing its schema again; a batch number (other schema bytes)
    still travels, and a bad body behind the known schema bytes is still refused, each time."""
    table = trajectory_table([row(0, 4), row(1, 5)])
    for _ in range(2):
        assert decode_table(encode_table(table)).to_pylist() == table.to_pylist()
        assert decode_batch(encode_table(table, batch_seq=3))[1] == 3
        assert decode_batch(encode_table(table))[1] is None
        with pytest.raises(SchemaError, match="[Oo]ffset"):
            decode_table(bad_middle_offset())
