"""Arrow bodies are validated in full before anything reads them: exactly one uncompressed IPC stream a frame.

The frames here are the review's: a 3 KB episode whose middle list offset points 2 GB away (it passed reward and
replay, then crashed the learner in ``to_pylist``), a zstd-compressed body that expands a thousandfold, and two
streams (or trailing bytes) in one frame.
"""

import subprocess
import sys
import textwrap

import pyarrow as pa
import pytest

from streams.schema import Columns as C
from streams.schema import SchemaError, decode_batch, decode_table, encode_table, trajectory_table
from tests.factories import bad_middle_offset, compressed, prompt_row as row



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
