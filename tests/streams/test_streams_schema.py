import pyarrow as pa
import pytest
import zmq

from streams.schema import (
    FIELDS,
    SCHEMA_VERSION,
    TRAJECTORY_SCHEMA,
    Columns,
    SchemaError,
    decode_table,
    encode_table,
    trajectory_table,
)

C = Columns


def row(turn: int, **changes) -> dict:
    values = {
        C.EPISODE_ID: "ep-1",
        C.ENV_NAME: "tictactoe",
        C.SEED: 2**40 + 7,
        C.TURN: turn,
        C.AGENT: turn % 2,
        C.MATCHUP: "main,main",
        C.POLICY_ID: "main",
        C.PROMPT_IDS: list(range(turn + 3)),
        C.ACTION_IDS: [5, 6][:turn],  # turn 0 has an empty action
        C.ACTION_TEXT: f"move {turn}",
        C.BEHAVIOUR_LOGPROBS: [-0.5, -0.25][:turn],
        C.POLICY_VERSIONS: [3, 4][:turn],
        C.REWARD: 0.5 * turn,
        C.TERMINATED: turn == 2,
        C.TRUNCATED: False,
        C.EPISODE_RETURN: 1.0,
        C.INVALID_ACTION: turn == 1,
        C.CREATED_AT: 1700000000.25,
        C.GENERATED_AT: 1700000001.5,
        C.SCORED_AT: 1700000002.75,
    }
    values.update(changes)
    return values


def ipc(table: pa.Table) -> bytes:
    """Arrow IPC bytes written directly, bypassing encode_table's checks."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def test_columns_are_declared_once():
    declared = {value for name, value in vars(Columns).items() if name.isupper()}
    assert declared == {name for name, _ in FIELDS}
    assert TRAJECTORY_SCHEMA.metadata == {b"tidal.schema_version": str(SCHEMA_VERSION).encode()}


def test_round_trip_keeps_every_column():
    rows = [row(0), row(1), {**row(2), C.ROLE: "solver", C.SCORED_BY: "judge:tiny"}]
    table = trajectory_table(rows)
    assert table.schema.equals(TRAJECTORY_SCHEMA, check_metadata=True)
    decoded = decode_table(encode_table(table))
    assert decoded.schema.equals(TRAJECTORY_SCHEMA, check_metadata=True)
    assert decoded.to_pylist() == [{C.ROLE: "", C.SCORED_BY: "", C.ACTION_TRUNCATED: False, **r}
                                   for r in rows]  # left out: empty, or false
    assert decoded.column(C.ACTION_IDS).to_pylist() == [[], [5], [5, 6]]


@pytest.mark.parametrize("wrap", [bytes, memoryview, zmq.Frame], ids=["bytes", "memoryview", "frame"])
def test_decode_does_not_copy(wrap):
    payload = wrap(encode_table(trajectory_table([row(2)] * 100)))
    source = pa.py_buffer(payload)
    values = decode_table(payload).column(C.PROMPT_IDS).chunks[0].values.buffers()[1]
    assert source.address <= values.address < source.address + source.size


def test_empty_table_round_trips():
    assert decode_table(encode_table(trajectory_table([]))).num_rows == 0


def test_other_version_is_rejected():
    table = trajectory_table([row(1)]).replace_schema_metadata({b"tidal.schema_version": b"4"})
    with pytest.raises(SchemaError, match="trajectory schema version 4, expected 3"):
        decode_table(ipc(table))
    with pytest.raises(SchemaError, match="version 4"):
        encode_table(table)


def test_missing_version_is_rejected():
    table = trajectory_table([row(1)]).replace_schema_metadata(None)
    with pytest.raises(SchemaError, match="version missing"):
        decode_table(ipc(table))


def test_missing_and_unknown_columns_are_named():
    broken = row(1, bonus=1)
    del broken[C.REWARD]
    with pytest.raises(SchemaError, match=r"row 0: missing columns \['reward'\], unknown columns \['bonus'\]"):
        trajectory_table([broken])


def test_decode_rejects_wrong_columns():
    table = trajectory_table([row(1)])
    with pytest.raises(SchemaError, match=r"missing columns \['seed'\]"):
        decode_table(ipc(table.drop_columns([C.SEED])))
    retyped = table.set_column(table.schema.get_field_index(C.TURN), C.TURN, pa.array([1], pa.int64()))
    with pytest.raises(SchemaError, match="turn is int64, expected int32"):
        decode_table(ipc(retyped))


def test_values_of_the_wrong_type_raise_schema_error():
    with pytest.raises(SchemaError, match="do not fit"):
        trajectory_table([row(1, **{C.SEED: "one"})])


@pytest.mark.parametrize("garbage", [b"", b"not arrow at all", b"\xff" * 64])
def test_garbage_bytes_raise_schema_error(garbage):
    with pytest.raises(SchemaError, match="not an Arrow IPC stream"):
        decode_table(garbage)


@pytest.mark.parametrize("version", [1, 2])
def test_a_spill_of_an_older_schema_is_read_with_the_newer_columns_at_their_defaults(tmp_path, version):
    """A run spilled before role and scored_by (version 1) or action_truncated (version 2) existed resumes: its
    episodes come back with those columns empty or false, and what the spill had, as it was."""
    from actors.replay.spill import _read_batches
    from streams.schema import SCHEMA_V1, SCHEMA_V2, upgrade_batch

    schema = {1: SCHEMA_V1, 2: SCHEMA_V2}[version]
    rows = [row(1, **{C.ROLE: "" if version == 1 else "solver"}), row(2)]
    old = trajectory_table(rows).select([f.name for f in schema]).replace_schema_metadata(schema.metadata)
    path = tmp_path / "episodes-old.arrows"
    with open(path, "wb") as f, pa.ipc.new_stream(f, schema) as writer:
        writer.write_table(old)
    batches = list(_read_batches(path))
    assert [b.schema.equals(TRAJECTORY_SCHEMA) for b in batches] == [True] and batches[0].num_rows == 2
    assert batches[0].column(C.ACTION_TRUNCATED).to_pylist() == [False, False]
    assert upgrade_batch(old.to_batches()[0]).to_pylist() == trajectory_table(rows).to_pylist()
