"""Values checked before anything keeps them: one validation of every trajectory row that arrives.

`decode_table` guarantees types and a well-formed Arrow table; this module checks the values, row by row, so
that a well-typed but poisonous row (a null id, per-token lists of different lengths, a token id outside the
vocabulary, a NaN reward, a negative version) is rejected where it arrives instead of crashing or poisoning
whatever keeps it (replay's spill, the learner's batch and, through it, every parameter).

``check_rows`` returns the rows that pass and the rejected ones counted by reason (a row counts once, under its
first failing check); the rest of the table goes on. ``Rejections`` keeps an actor's counts and logs them at a
bounded rate. The reasons:

- ``null``: a null in any column, or a null element of a list column;
- ``missing_id``: an empty ``episode_id``;
- ``duplicate_row``: a second row with the same (episode, turn, agent);
- ``other_episode``: in one episode's table, a row of another episode;
- ``empty_prompt``: no prompt tokens;
- ``no_action``: no action tokens (nothing to train on; a batch of only such rows once crashed the learner);
- ``ragged``: ``action_ids``, ``behaviour_logprobs`` and ``policy_versions`` of different lengths;
- ``too_long``: more prompt and action tokens than ``max_tokens`` (where the checker knows it: the model's
  context; a learner's update grows with the square of a row's length, so one row of 16 k tokens stalled it);
- ``token_id``: a prompt or action token id below 0 or at or above the vocabulary (where the checker knows it);
- ``non_finite``: a NaN or infinite reward, return, timestamp or behaviour log-prob;
- ``logprob``: a behaviour log-prob above 0 (``MAX_LOGPROB``: a probability is at most 1);
- ``magnitude``: a reward or return beyond ``max_abs`` either way (where the checker knows it: the reward
  actor's ``max_abs``; a finite 3e38 made a role's baseline 3.75e37, and every later step skipped);
- ``version``: a policy version below 0, or above ``max_version`` (where the checker knows it).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streams.schema import FIELDS, Columns

log = logging.getLogger(__name__)

REASONS = ("null", "missing_id", "duplicate_row", "other_episode", "empty_prompt", "no_action", "ragged", "too_long",
           "token_id", "non_finite", "logprob", "magnitude", "version")
MAX_LOGPROB = 1e-3  # a log-probability is at most 0; this little above it is an engine's rounding, not poison
FLOATS = (Columns.REWARD, Columns.EPISODE_RETURN, Columns.CREATED_AT, Columns.GENERATED_AT, Columns.SCORED_AT)
PER_TOKEN = (Columns.ACTION_IDS, Columns.BEHAVIOUR_LOGPROBS, Columns.POLICY_VERSIONS)
LIST_COLUMNS = tuple(name for name, kind in FIELDS if pa.types.is_list(kind))


@dataclass
class Checked:
    """The rows that passed (``table``), and those rejected: counted by reason, the first one described."""

    table: pa.Table
    rejected: dict[str, int] = field(default_factory=dict)
    example: str = ""

    @property
    def rejected_rows(self) -> int:
        return sum(self.rejected.values())


def check_rows(table: pa.Table, *, vocab_size: int | None = None, max_version: int | None = None,
               max_tokens: int | None = None, max_abs: float | None = None, one_episode: bool = False) -> Checked:
    """``table`` (a decoded trajectory table: the schema's columns and types) without the rows whose values are
    unusable. ``vocab_size``: token ids must be below it; ``max_version``: policy versions must not be above it;
    ``max_tokens``: a row's prompt and action tokens together must not be more; ``max_abs``: rewards and returns
    must lie within it either way; ``one_episode``: the table is one episode, so every row must carry the first
    good row's episode id."""
    rows = table.num_rows
    reason = np.full(rows, -1, dtype=np.int8)  # index into REASONS; -1: fine so far
    if not rows:
        return Checked(table)

    def flag(name: str, bad) -> None:
        bad = np.asarray(bad, dtype=bool)
        reason[(reason < 0) & bad] = REASONS.index(name)

    lists = {name: _ListColumn(table.column(name)) for name in LIST_COLUMNS}
    nulls = np.zeros(rows, dtype=bool)
    for name in table.column_names:
        column = table.column(name)
        if column.null_count:
            nulls |= _filled(column.is_null(), False)
    for column in lists.values():
        nulls |= column.rows_where(column.nulls())
    flag("null", nulls)
    ids = table.column(Columns.EPISODE_ID)
    flag("missing_id", _filled(pc.equal(pc.utf8_length(ids), 0), False))
    flag("duplicate_row", _repeated(table, reason))
    if one_episode:
        ok = np.flatnonzero(reason < 0)
        if len(ok):
            flag("other_episode", _filled(pc.not_equal(ids, ids[int(ok[0])].as_py()), False))
    flag("empty_prompt", lists[Columns.PROMPT_IDS].lengths == 0)
    lengths = [lists[name].lengths for name in PER_TOKEN]
    flag("no_action", lengths[0] == 0)
    flag("ragged", (lengths[0] != lengths[1]) | (lengths[0] != lengths[2]))
    if max_tokens is not None:
        flag("too_long", lists[Columns.PROMPT_IDS].lengths + lengths[0] > max_tokens)
    high = np.inf if vocab_size is None else vocab_size - 1
    for name in (Columns.PROMPT_IDS, Columns.ACTION_IDS):
        flag("token_id", lists[name].rows_where(lists[name].outside(0, high)))
    finite = np.ones(rows, dtype=bool)
    for name in FLOATS:
        finite &= np.isfinite(_filled(table.column(name), 0.0))
    logprobs = lists[Columns.BEHAVIOUR_LOGPROBS]
    finite &= ~logprobs.rows_where(~np.isfinite(logprobs.numbers(0.0)))
    flag("non_finite", ~finite)
    flag("logprob", logprobs.rows_where(logprobs.numbers(0.0) > MAX_LOGPROB))
    if max_abs is not None:
        reward, ret = (np.abs(_filled(table.column(name), 0.0)) for name in (Columns.REWARD, Columns.EPISODE_RETURN))
        flag("magnitude", (reward > max_abs) | (ret > max_abs))
    versions = lists[Columns.POLICY_VERSIONS]
    flag("version", versions.rows_where(versions.outside(0, np.inf if max_version is None else max_version)))
    bad = reason >= 0
    if not bad.any():
        return Checked(table)
    counts = np.bincount(reason[bad], minlength=len(REASONS))
    first = int(np.flatnonzero(bad)[0])
    example = (f"row {first} (episode {ids[first].as_py()!r}, turn {table.column(Columns.TURN)[first].as_py()}): "
               f"{REASONS[reason[first]]}")
    return Checked(table.filter(pa.array(~bad)), {REASONS[i]: int(n) for i, n in enumerate(counts) if n}, example)


def within_context(table: pa.Table, max_tokens: int) -> Checked:
    """``table`` without the rows of more than ``max_tokens`` prompt and action tokens together (``too_long``):
    the one check of `check_rows` for a holder that runs the others elsewhere (the learner, whose trainer checks
    the rest)."""
    prompts, actions = (_ListColumn(table.column(name)).lengths for name in (Columns.PROMPT_IDS, Columns.ACTION_IDS))
    lengths = prompts + actions
    long = lengths > max_tokens
    if not long.any():
        return Checked(table)
    first = int(np.flatnonzero(long)[0])
    example = (f"row {first} (episode {table.column(Columns.EPISODE_ID)[first].as_py()!r}): too_long "
               f"({int(lengths[first])} tokens, more than {max_tokens})")
    return Checked(table.filter(pa.array(~long)), {"too_long": int(long.sum())}, example)


class Rejections:
    """An actor's rejected rows (or messages), counted by reason, and logged at most every ``every_s``."""

    def __init__(self, what: str, every_s: float = 30.0):
        self.what, self.every_s = what, every_s
        self.counts: dict[str, int] = {}
        self._logged_at, self._logged_total = -float("inf"), 0

    def add(self, rejected: dict[str, int], example: str = "") -> None:
        for reason, n in rejected.items():
            self.counts[reason] = self.counts.get(reason, 0) + n
        now, total = time.monotonic(), self.total()
        if total > self._logged_total and now - self._logged_at >= self.every_s:
            log.warning("%s: %d rejected since the last report (%d in all, by reason %s); e.g. %s", self.what,
                        total - self._logged_total, total, self.counts, example)
            self._logged_at, self._logged_total = now, total

    def total(self) -> int:
        return sum(self.counts.values())


MIN_VERSION_SLACK = 4  # a request may ask for this many versions past the newest its rollout heard announced (its
# env actor follows the same announcements, and may hear one first)


def version_beyond(min_version: int, announced: int | None) -> str:
    """Why a request's ``min_version`` is beyond any version a rollout can expect to hold, the newest it heard
    announced being ``announced`` (None: none yet, so no bound is known); "" if it is not."""
    if announced is None or min_version <= announced + MIN_VERSION_SLACK:
        return ""
    return (f"min_version {min_version} is beyond the newest version announced ({announced}) plus "
            f"{MIN_VERSION_SLACK}")


class RequestChecks:
    """What a rollout actor checks of a generation request before it queues it (the message's decoder already
    refused an empty prompt, negative token ids and temperatures or lengths out of range): every prompt token id
    below the tokenizer's ``vocab_size`` (an id beyond the model's embedding crashes the sampler) and a
    ``min_version`` that is not negative, nor beyond the newest version announced plus ``MIN_VERSION_SLACK`` (one
    request that asked for version 10**12 once stopped an hf rollout for every requester). A refused request is
    counted by reason and logged at a bounded rate."""

    def __init__(self, name: str):
        self.rejected = Rejections(f"{name}: generation requests")

    def refusal(self, request, vocab_size: int, announced: int | None = None) -> str:
        """Why ``request`` (a ``GenerationRequest``) must not be sampled ("" if it may); ``announced``: the
        newest version its rollout heard announced (None: none yet)."""
        reason, why = "", ""
        highest = max(request.prompt_ids)
        if highest >= vocab_size:
            reason, why = "token_id", f"prompt token id {highest} is outside the vocabulary of {vocab_size}"
        elif request.min_version < 0:
            reason, why = "version", f"min_version {request.min_version} is negative"
        elif beyond := version_beyond(request.min_version, announced):
            reason, why = "version", beyond
        if reason:
            self.rejected.add({reason: 1}, f"request {request.request_id} from {request.reply_to!r}: {why}")
        return why

    def statistics(self) -> dict:
        return {"rejected_requests": self.rejected.total(), "rejected_by_reason": dict(self.rejected.counts)}


class _ListColumn:
    """A list column's rows as numpy: each row's length, and its elements (the table is validated: the offsets
    rise and stay inside the values; a null list's range is taken as it is, and that row is rejected as null)."""

    def __init__(self, column):
        column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        offsets = column.offsets.to_numpy()
        self.lengths = np.diff(offsets)
        self.values = column.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
        self._parents = None

    def numbers(self, fill) -> np.ndarray:
        return _filled(self.values, fill)

    def nulls(self) -> np.ndarray | None:
        return _filled(self.values.is_null(), False) if self.values.null_count else None

    def outside(self, low, high) -> np.ndarray:
        values = self.numbers(0)
        return (values < low) | (values > high)

    def rows_where(self, hits: np.ndarray | None) -> np.ndarray:
        """The rows that hold an element where ``hits`` is True."""
        if hits is None or not hits.any():
            return np.zeros(len(self.lengths), dtype=bool)
        if self._parents is None:
            self._parents = np.repeat(np.arange(len(self.lengths)), self.lengths)
        return np.bincount(self._parents[hits], minlength=len(self.lengths)).astype(bool)


def _filled(array, value) -> np.ndarray:
    """An Arrow array (or chunked array) as numpy, its nulls replaced by ``value``."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if array.null_count:
        array = pc.fill_null(array, value)
    return array.to_numpy(zero_copy_only=False)


def _repeated(table: pa.Table, reason: np.ndarray) -> np.ndarray:
    """Rows whose (episode, turn, agent) an earlier row not yet rejected already has."""
    keys = zip(table.column(Columns.EPISODE_ID).to_pylist(), table.column(Columns.TURN).to_pylist(),
               table.column(Columns.AGENT).to_pylist())
    seen, repeated = set(), np.zeros(table.num_rows, dtype=bool)
    for i, key in enumerate(keys):
        if reason[i] >= 0:
            continue
        repeated[i] = key in seen
        seen.add(key)
    return repeated
