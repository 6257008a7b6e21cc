"""The trajectory record: one row is one agent-turn; a batch holds whole episodes only.

Column names are declared once, here (`Columns`), and the Arrow schema is built from one declaration
(`FIELDS`). Batches travel as Arrow IPC streams; a receiver rejects a batch of another schema version.
"""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa

SCHEMA_VERSION = 3  # 2: role and scored_by; 3: action_truncated (an older spill is read with them empty or false:
# `upgrade_batch`)
VERSION_KEY = b"tidal.schema_version"


class Columns:
    """Names of the trajectory columns. Use these, never string literals."""

    EPISODE_ID = "episode_id"
    ENV_NAME = "env_name"
    SEED = "seed"
    TURN = "turn"
    AGENT = "agent"  # seat / role in the game
    MATCHUP = "matchup"  # who sat where, e.g. "main,random", and a drawn task type ("main,main/a+b"): baselines are
    # kept per (matchup, agent) (actors.env.episode.matchup)
    POLICY_ID = "policy_id"
    PROMPT_IDS = "prompt_ids"
    ACTION_IDS = "action_ids"
    ACTION_TEXT = "action_text"
    BEHAVIOUR_LOGPROBS = "behaviour_logprobs"  # one per action token, from the engine that sampled it
    POLICY_VERSIONS = "policy_versions"  # one per action token
    REWARD = "reward"  # this turn
    TERMINATED = "terminated"
    TRUNCATED = "truncated"
    EPISODE_RETURN = "episode_return"  # per agent
    INVALID_ACTION = "invalid_action"
    CREATED_AT = "created_at"  # unix seconds
    GENERATED_AT = "generated_at"
    SCORED_AT = "scored_at"
    ROLE = "role"  # the agent's role where the game names roles (proposer, solver, ...); "" : its seat is its role
    SCORED_BY = "scored_by"  # who set the reward: "" for the game's own outcome, else the scorer or judge
    ACTION_TRUNCATED = "action_truncated"  # the completion was cut at its token budget (no EOS, no stop string)


FIELDS: tuple[tuple[str, pa.DataType], ...] = (
    (Columns.EPISODE_ID, pa.string()),
    (Columns.ENV_NAME, pa.string()),
    (Columns.SEED, pa.int64()),
    (Columns.TURN, pa.int32()),
    (Columns.AGENT, pa.int32()),
    (Columns.MATCHUP, pa.string()),
    (Columns.POLICY_ID, pa.string()),
    (Columns.PROMPT_IDS, pa.list_(pa.int32())),
    (Columns.ACTION_IDS, pa.list_(pa.int32())),
    (Columns.ACTION_TEXT, pa.string()),
    (Columns.BEHAVIOUR_LOGPROBS, pa.list_(pa.float32())),
    (Columns.POLICY_VERSIONS, pa.list_(pa.int32())),
    (Columns.REWARD, pa.float32()),
    (Columns.TERMINATED, pa.bool_()),
    (Columns.TRUNCATED, pa.bool_()),
    (Columns.EPISODE_RETURN, pa.float32()),
    (Columns.INVALID_ACTION, pa.bool_()),
    (Columns.CREATED_AT, pa.float64()),
    (Columns.GENERATED_AT, pa.float64()),
    (Columns.SCORED_AT, pa.float64()),
    (Columns.ROLE, pa.string()),
    (Columns.SCORED_BY, pa.string()),
    (Columns.ACTION_TRUNCATED, pa.bool_()),
)
# a row may leave these out
OPTIONAL: dict[str, object] = {Columns.ROLE: "", Columns.SCORED_BY: "", Columns.ACTION_TRUNCATED: False}

BATCH_SEQ_KEY = b"tidal.batch_seq"
TRAJECTORY_SCHEMA = pa.schema(FIELDS, metadata={VERSION_KEY: str(SCHEMA_VERSION).encode()})
NAMES: tuple[str, ...] = tuple(name for name, _ in FIELDS)
SCHEMA_V1 = pa.schema([f for f in FIELDS if f[0] not in OPTIONAL], metadata={VERSION_KEY: b"1"})
SCHEMA_V2 = pa.schema([f for f in FIELDS if f[0] != Columns.ACTION_TRUNCATED], metadata={VERSION_KEY: b"2"})
OLDER_SCHEMAS = (SCHEMA_V1, SCHEMA_V2)  # spills of these are read (`upgrade_batch`)


def upgrade_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A record batch of an older spill (`OLDER_SCHEMAS`) as the current version: the columns it lacks hold their
    `OPTIONAL` defaults (``role`` and ``scored_by`` empty, ``action_truncated`` false)."""
    if batch.schema.equals(TRAJECTORY_SCHEMA):
        return batch
    columns = [batch.column(name) if name in batch.schema.names else
               pa.array([OPTIONAL[name]] * batch.num_rows, kind) for name, kind in FIELDS]
    return pa.RecordBatch.from_arrays(columns, schema=TRAJECTORY_SCHEMA)


class SchemaError(ValueError):
    """A trajectory batch that does not match TRAJECTORY_SCHEMA (or is not Arrow IPC at all)."""


def trajectory_table(rows: list[dict]) -> pa.Table:
    """Build a table with exactly TRAJECTORY_SCHEMA from rows keyed by `Columns` (the `OPTIONAL` ones may be left
    out: their defaults).

    Column by column, each with its type: for the few rows of an episode, several times faster than Arrow's
    row-by-row ``Table.from_pylist``.
    """
    expected, required = set(NAMES), set(NAMES) - set(OPTIONAL)
    for index, row in enumerate(rows):
        if row.keys() != expected and not required <= row.keys() <= expected:
            raise SchemaError(f"trajectory row {index}: {_difference(set(row) | set(OPTIONAL), expected)}")
    return columns_table({name: [row.get(name, OPTIONAL.get(name)) for row in rows] for name in NAMES})


def columns_table(columns: dict[str, list]) -> pa.Table:
    """Build a table with exactly TRAJECTORY_SCHEMA from one list of values per column (every name of `Columns`,
    the lists of one length): what an env actor keeps an episode's rows as (``actors.env.columns``)."""
    if columns.keys() != set(NAMES):
        raise SchemaError(f"trajectory columns: {_difference(set(columns), set(NAMES))}")
    if len({len(values) for values in columns.values()}) > 1:
        raise SchemaError("trajectory columns of different lengths")
    try:
        arrays = [_column(columns[name], kind) for name, kind in FIELDS]
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as error:
        raise SchemaError(f"trajectory rows do not fit the schema: {error}") from error
    return pa.Table.from_arrays(arrays, schema=TRAJECTORY_SCHEMA)


_PACKED = {pa.list_(pa.int32()): "<i4", pa.list_(pa.float32()): "<f4"}  # list columns of 4-byte numbers


def _column(values: list, kind: pa.DataType) -> pa.Array:
    """One column. A list column whose every value holds its numbers' bytes (``packed``: token ids and completions
    from the generation path, ``streams.generation_messages.Packed``) is made from them, not number by number."""
    dtype = _PACKED.get(kind)
    if dtype is None or not values or any(len(getattr(v, "packed", b"")) != 4 * len(v) or not v for v in values):
        return pa.array(values, type=kind)
    offsets = np.zeros(len(values) + 1, np.int32)
    np.cumsum([len(v) for v in values], out=offsets[1:])
    flat = np.frombuffer(b"".join(v.packed for v in values), dtype)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, type=kind.value_type))


def encode_table(table: pa.Table, batch_seq: int | None = None) -> bytes:
    """Serialize a trajectory table as an Arrow IPC stream (checked against the schema first).

    ``batch_seq``: a training batch's number in its run, which the learner's data cursor counts (`decode_batch`).
    """
    if not table.schema.equals(TRAJECTORY_SCHEMA, check_metadata=True):  # as trajectory_table builds it: as is
        if table.schema.metadata and VERSION_KEY in table.schema.metadata:
            _check_version(table.schema)
        table = _conform(table)
    if batch_seq is not None:
        table = table.replace_schema_metadata({**TRAJECTORY_SCHEMA.metadata, BATCH_SEQ_KEY: str(batch_seq).encode()})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


_SCHEMA_MESSAGE = TRAJECTORY_SCHEMA.serialize().to_pybytes()  # an IPC stream's first message
_END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"


def encode_episodes(episodes: list[list[dict]]) -> list[bytes]:
    """Each episode's rows as an IPC stream of its own (one frame an episode, as ``encode_table(trajectory_table(
    rows))`` gives: the same table once decoded), the columns built once for all of them: Arrow's fixed cost per
    column and per call is paid once a batch, not once an episode. SchemaError as ``trajectory_table``'s."""
    rows = [row for episode in episodes for row in episode]
    if not rows:
        return [encode_table(trajectory_table([])) for _ in episodes]
    return _sliced(trajectory_table(rows), [len(episode) for episode in episodes])


def encode_episode_columns(episodes: list[dict[str, list]]) -> list[bytes]:
    """``encode_episodes`` for episodes kept as columns (``columns_table``'s): each episode's frame body, the
    batch's columns joined and built once."""
    if len(episodes) == 1:
        return _sliced(columns_table(episodes[0]), [len(episodes[0][Columns.TURN])])
    joined = {name: [value for episode in episodes for value in episode[name]] for name in NAMES}
    return _sliced(columns_table(joined), [len(episode[Columns.TURN]) for episode in episodes])


def _sliced(table: pa.Table, lengths: list[int]) -> list[bytes]:
    """One IPC stream per run of ``lengths`` rows of ``table``."""
    if not table.num_rows:
        return [encode_table(table) for _ in lengths]
    (batch,) = table.combine_chunks().to_batches()
    bodies, start = [], 0
    for length in lengths:
        bodies.append(b"".join((_SCHEMA_MESSAGE, batch.slice(start, length).serialize().to_pybytes(),
                                _END_OF_STREAM)))
        start += length
    return bodies


def decode_table(buf) -> pa.Table:
    """Read an Arrow IPC stream without copying: the table's buffers point into `buf`.

    `buf` is bytes, a memoryview, or anything else with the buffer protocol (a zmq.Frame). It must hold exactly
    one uncompressed IPC stream and nothing after it, and the table is validated in full (every offset, every
    string's UTF-8) before anything reads it: a bad offset in the middle of a list column would otherwise read
    outside the buffer (a crash in ``to_pylist``, far from the socket it came from), and a compressed body can
    expand a small frame a thousandfold.
    """
    return _read_stream(buf)[0]


def decode_batch(buf) -> tuple[pa.Table, int | None]:
    """A training batch and its number (None for a batch sent without one)."""
    table, metadata = _read_stream(buf)
    found = metadata.get(BATCH_SEQ_KEY)
    try:
        return table, int(found) if found is not None else None
    except ValueError as error:
        raise SchemaError(f"batch number {found!r} is not an integer") from error


def _read_stream(buf) -> tuple[pa.Table, dict]:
    """The table of the one IPC stream that is the whole of ``buf`` (conformed, validated) and its schema's
    metadata; SchemaError for anything else.

    Each record batch is validated in full as it is read (what validating the table would check, at a third of
    the cost). A schema message whose bytes are those of `TRAJECTORY_SCHEMA` itself (every stream `encode_table`
    writes without a batch number) is not parsed again: the same bytes parse to the same schema.
    """
    source = pa.BufferReader(pa.py_buffer(buf))
    try:
        messages = pa.ipc.MessageReader.open_stream(source)
        first = messages.read_next_message()
        if first.type != "schema":
            raise SchemaError(f"an Arrow IPC stream starts with its schema, not a {first.type} message")
        schema = _schema_of(first)
        batches = []
        for message in messages:  # up to the end-of-stream marker (or the end of the bytes)
            if message.type != "record batch":
                raise SchemaError(f"a {message.type} message in a trajectory stream (one schema, then record batches)")
            if _compressed(message.metadata):
                raise SchemaError("a compressed IPC body: trajectories travel uncompressed")
            batch = pa.ipc.read_record_batch(message, schema)
            _validate(batch)
            batches.append(batch)
        if source.tell() != source.size():
            raise SchemaError(f"{source.size() - source.tell()} bytes after the IPC stream's end (one stream a frame)")
        table = pa.Table.from_batches(batches, schema)
    except SchemaError:
        raise
    except (pa.ArrowException, OSError, TypeError, ValueError, StopIteration, struct.error, IndexError) as error:
        raise SchemaError(f"not an Arrow IPC stream: {error or type(error).__name__}") from error
    if any(schema is known for known in _PARSED.values()):  # TRAJECTORY_SCHEMA, metadata and all
        return table, dict(TRAJECTORY_SCHEMA.metadata)
    metadata = dict(schema.metadata or {})
    if not table.schema.equals(TRAJECTORY_SCHEMA, check_metadata=True):  # the common case: nothing to conform
        table = _conform(table)
    return table, metadata


_PARSED: dict[bytes, pa.Schema] = {}  # one entry: the bytes of TRAJECTORY_SCHEMA's schema message, and it parsed


def _schema_of(message) -> pa.Schema:
    """The schema a schema message holds, its version checked."""
    key = message.metadata.to_pybytes()
    known = _PARSED.get(key)
    if known is not None:
        return known
    schema = pa.ipc.read_schema(message)
    _check_version(schema)
    if not _PARSED and schema.equals(TRAJECTORY_SCHEMA, check_metadata=True):
        _PARSED[key] = schema
    return schema


def _validate(batch: pa.RecordBatch) -> None:
    try:
        batch.validate(full=True)
    except pa.ArrowException as error:
        raise SchemaError(f"an invalid Arrow table: {error}") from error


def _compressed(metadata: pa.Buffer) -> bool:
    """Does this record batch message (its flatbuffer ``Message``) declare compressed buffers?

    ``Message``'s field 2 is its header, here a ``RecordBatch``, whose field 3 is ``compression`` (Arrow's
    Message.fbs); Arrow has already verified the flatbuffer, and would decompress on reading.
    """
    data = metadata.to_pybytes()
    root = struct.unpack_from("<I", data, 0)[0]
    header = _field(data, root, 2)
    if header is None:
        return False
    batch = header + struct.unpack_from("<I", data, header)[0]
    return _field(data, batch, 3) is not None


def _field(data: bytes, table: int, index: int) -> int | None:
    """Where field ``index`` of the flatbuffer table at ``table`` lies (None: absent)."""
    vtable = table - struct.unpack_from("<i", data, table)[0]
    if 4 + 2 * index + 2 > struct.unpack_from("<H", data, vtable)[0]:
        return None
    offset = struct.unpack_from("<H", data, vtable + 4 + 2 * index)[0]
    return table + offset if offset else None


def _check_version(schema: pa.Schema) -> None:
    found = (schema.metadata or {}).get(VERSION_KEY)
    if found is None:
        raise SchemaError(f"trajectory schema version missing, expected {SCHEMA_VERSION}")
    if found != str(SCHEMA_VERSION).encode():
        shown = found.decode(errors="replace")
        raise SchemaError(f"trajectory schema version {shown}, expected {SCHEMA_VERSION}")


def _conform(table: pa.Table) -> pa.Table:
    """The table with the schema's column order and metadata, or SchemaError naming what differs."""
    got = {field.name: field.type for field in table.schema}
    problems = [_difference(set(got), set(NAMES))] if set(got) != set(NAMES) else []
    if len(got) != table.num_columns:
        problems.append("duplicate column names")
    problems += [
        f"{name} is {got[name]}, expected {kind}"
        for name, kind in FIELDS
        if name in got and got[name] != kind
    ]
    if problems:
        raise SchemaError("trajectory columns do not match the schema: " + "; ".join(problems))
    return table.select(list(NAMES)).replace_schema_metadata(TRAJECTORY_SCHEMA.metadata)


def _difference(got: set[str], expected: set[str]) -> str:
    parts = []
    if expected - got:
        parts.append(f"missing columns {sorted(expected - got)}")
    if got - expected:
        parts.append(f"unknown columns {sorted(got - expected)}")
    return ", ".join(parts)
