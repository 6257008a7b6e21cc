"""Generation requests and completions, many to a frame: the generation path's messages.

An env actor asks for the moves of many episodes at once, so a ``generate`` frame carries a batch of requests
and a ``completion`` frame a batch of completions (one request or completion is a batch of one: ``to_body`` and
``from_body``). A batch is columnar: each per-request number is one little-endian array (ids, prompt lengths,
temperatures, token budgets, min versions), the prompts are one array of token ids, cut by their lengths; a
completion batch likewise (ids, lengths, tokens, log-probs, versions, finished flags) and a list of errors. So
a batch costs one msgpack map and a few NumPy conversions whatever its size. A batch holds at most ``MAX_BATCH``
requests, and its frame stays within its kind's limit (``wire.FRAME_LIMITS``): ``split_requests`` and
``split_completions`` cut a longer list into such batches. A batch with any bad request is refused whole.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from streams.message_fields import _address, _fields
from streams.wire import MAX_NEW_TOKENS, MAX_PROMPT_TOKENS, FrameError, Shape, pack

MAX_BATCH = 4096  # requests (or completions) in one frame
_ERROR_CHARS = 500  # a refusal's reason is cut to this
_BATCH_BYTES = 48 * 2**10  # what a batch's fields other than its token arrays may take (within the 64 KiB margin)


class Packed(list):
    """Numbers (a list, as any other) that also hold their little-endian 4-byte values, ``packed``: what a frame or
    an Arrow column takes of them, made once (a prompt's ids, when the prompt cache first encodes it). Made whole and never changed in place (a slice or a copy is a plain list);
    a reader that finds ``packed`` of another length than the list's ignores it."""

    __slots__ = ("packed",)

    @classmethod
    def of(cls, values, packed: bytes) -> Packed:
        made = cls(values)
        made.packed = packed
        return made


def packed_bytes(lists, dtype: str) -> bytes:
    """The 4-byte values of ``lists`` (of numbers) one after another: what each ``Packed`` holds, the rest converted."""
    if all(type(values) is Packed and len(values.packed) == 4 * len(values) for values in lists):
        return b"".join(values.packed for values in lists)
    return np.asarray(list(itertools.chain.from_iterable(lists)), dtype).tobytes()


@dataclass
class GenerationRequest:
    """Sample a continuation of ``prompt_ids`` with policy ``policy_id``; reply to ``reply_to``.

    ``min_version``: the rollout actor must not sample with weights older than this (the env actor sets
    the learner version it knows of, so no token is older than what admission assumed).
    """

    request_id: int
    reply_to: str
    policy_id: str
    prompt_ids: list[int]
    temperature: float = 1.0
    max_tokens: int = 16
    min_version: int = 0

    def to_body(self) -> bytes:
        return encode_requests([self])

    @classmethod
    def from_body(cls, body) -> GenerationRequest:
        return _one(decode_requests(body), "generation request")


@dataclass
class Completion:
    """Sampled tokens with, for every token, the behaviour log-prob and the policy version that made it.

    ``error``: why the rollout actor could not sample this request (its engine refused the request's
    settings); then there are no tokens, and the env actor drops the episode that asked, with the reason.
    """

    request_id: int
    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finished: bool  # ended with EOS or a stop string; False when cut at max_tokens
    error: str = ""

    def to_body(self) -> bytes:
        return encode_completions([self])

    @classmethod
    def refused(cls, request_id: int, error: str) -> Completion:
        return cls(request_id, [], [], [], False, error[:_ERROR_CHARS])

    @classmethod
    def from_body(cls, body) -> Completion:
        return _one(decode_completions(body), "completion")


REQUEST_NAMES = ("ids", "reply_to", "policies", "lengths", "prompts", "temperatures", "max_tokens", "min_versions")
REQUEST_SHAPE = Shape(bin_len=4 * MAX_PROMPT_TOKENS, array_len=MAX_BATCH)  # the prompts: 4 bytes a token
COMPLETION_NAMES = ("ids", "lengths", "tokens", "logprobs", "versions", "finished", "errors")
COMPLETION_SHAPE = Shape(bin_len=4 * MAX_NEW_TOKENS, array_len=MAX_BATCH)  # ids, log-probs, versions: 4 bytes each


def encode_requests(requests: list[GenerationRequest]) -> bytes:
    """One frame's body of ``requests`` (1 to MAX_BATCH, all with the same ``reply_to``)."""
    if not 0 < len(requests) <= MAX_BATCH or any(r.reply_to != requests[0].reply_to for r in requests):
        raise ValueError(f"a batch holds 1 to {MAX_BATCH} requests with one reply_to, not {len(requests)}")
    values = (np.asarray([r.request_id for r in requests], "<i8").tobytes(), requests[0].reply_to,
              [r.policy_id for r in requests], np.asarray([len(r.prompt_ids) for r in requests], "<i4").tobytes(),
              packed_bytes([r.prompt_ids for r in requests], "<i4"),
              np.asarray([r.temperature for r in requests], "<f8").tobytes(),
              np.asarray([r.max_tokens for r in requests], "<i4").tobytes(),
              np.asarray([r.min_version for r in requests], "<i8").tobytes())
    return pack(dict(zip(REQUEST_NAMES, values)))


def decode_requests(body) -> list[GenerationRequest]:
    """The requests of a ``generate`` frame's body; FrameError naming what is wrong with a bad one."""
    f = _fields(body, REQUEST_NAMES, "generation request", (bytes, str, list, bytes, bytes, bytes, bytes, bytes),
                REQUEST_SHAPE)
    ids = _numbers(f["ids"], "<i8", "ids")
    count = len(ids)
    lengths, prompts = _numbers(f["lengths"], "<i4", "lengths", count), _numbers(f["prompts"], "<i4", "prompts")
    temperatures = _numbers(f["temperatures"], "<f8", "temperatures", count)
    max_tokens = _numbers(f["max_tokens"], "<i4", "max_tokens", count)
    min_versions = _numbers(f["min_versions"], "<i8", "min_versions", count)
    policies = f["policies"]
    if not count or len(policies) != count or any(not isinstance(p, str) for p in policies):
        raise FrameError(f"generation request batch of {count} ids and {len(policies)} policy names")
    if lengths.min() <= 0 or int(lengths.sum()) != len(prompts) or (len(prompts) and prompts.min() < 0):
        raise FrameError("generation request with an empty prompt or a negative token id, or prompt lengths that "
                         f"do not add up to its {len(prompts)} tokens")
    if not ((temperatures > 0) & (temperatures <= 100)).all() or max_tokens.min() < 1 or \
            max_tokens.max() > MAX_NEW_TOKENS:
        raise FrameError(f"generation request with temperature or max_tokens out of range (0, 100], "
                         f"[1, {MAX_NEW_TOKENS}]")
    reply_to = _address(f["reply_to"], "generation request")
    ends, flat = np.cumsum(lengths).tolist(), prompts.tolist()
    return [GenerationRequest(request_id, reply_to, policy, flat[end - length:end], temperature, tokens, version)
            for request_id, policy, length, end, temperature, tokens, version in zip(
                ids.tolist(), policies, lengths.tolist(), ends, temperatures.tolist(), max_tokens.tolist(),
                min_versions.tolist())]


def encode_completions(completions: list[Completion]) -> bytes:
    """One frame's body of ``completions`` (1 to MAX_BATCH)."""
    if not 0 < len(completions) <= MAX_BATCH:
        raise ValueError(f"a batch holds 1 to {MAX_BATCH} completions, not {len(completions)}")
    values = (np.asarray([c.request_id for c in completions], "<i8").tobytes(),
              np.asarray([len(c.token_ids) for c in completions], "<i4").tobytes(),
              packed_bytes([c.token_ids for c in completions], "<i4"),
              packed_bytes([c.logprobs for c in completions], "<f4"),
              packed_bytes([c.versions for c in completions], "<i4"),
              bytes(bool(c.finished) for c in completions), [c.error for c in completions])
    return pack(dict(zip(COMPLETION_NAMES, values)))


def decode_completions(body) -> list[Completion]:
    """The completions of a ``completion`` frame's body; FrameError naming what is wrong with a bad one."""
    f = _fields(body, COMPLETION_NAMES, "completion", (bytes, bytes, bytes, bytes, bytes, bytes, list),
                COMPLETION_SHAPE)
    ids = _numbers(f["ids"], "<i8", "ids")
    count = len(ids)
    lengths = _numbers(f["lengths"], "<i4", "lengths", count)
    tokens, logprobs = _numbers(f["tokens"], "<i4", "tokens"), _numbers(f["logprobs"], "<f4", "logprobs")
    versions = _numbers(f["versions"], "<i4", "versions")
    finished, errors = f["finished"], f["errors"]
    if not count or len(finished) != count or len(errors) != count or any(not isinstance(e, str) for e in errors):
        raise FrameError(f"completion batch of {count} ids, {len(finished)} finished flags, {len(errors)} errors")
    if lengths.min() < 0 or not int(lengths.sum()) == len(tokens) == len(logprobs) == len(versions):
        raise FrameError(f"completion with {len(tokens)} tokens, {len(logprobs)} log-probs, {len(versions)} "
                         f"versions for lengths adding up to {int(lengths.sum())}")
    ends = np.cumsum(lengths).tolist()  # (a completion's few numbers as plain lists: cheaper than keeping bytes)
    tokens, logprobs, versions = tokens.tolist(), logprobs.tolist(), versions.tolist()
    return [Completion(request_id, tokens[end - n:end], logprobs[end - n:end], versions[end - n:end], bool(done),
                       error)
            for request_id, n, end, done, error in zip(ids.tolist(), lengths.tolist(), ends, finished, errors)]


def split_requests(requests: list[GenerationRequest]) -> list[list[GenerationRequest]]:
    """``requests`` in batches that each fit one frame (MAX_BATCH of them, MAX_PROMPT_TOKENS of prompt)."""
    return _split(requests, lambda r: len(r.prompt_ids), MAX_PROMPT_TOKENS,
                  lambda r: 40 + len(r.policy_id))


def split_completions(completions: list[Completion]) -> list[list[Completion]]:
    """``completions`` in batches that each fit one frame (MAX_BATCH of them, MAX_NEW_TOKENS tokens)."""
    return _split(completions, lambda c: len(c.token_ids), MAX_NEW_TOKENS, lambda c: 24 + len(c.error) * 4)


def _split(items: list, tokens, max_tokens: int, other_bytes) -> list[list]:
    batches, batch, used, extra = [], [], 0, 0
    for item in items:
        n, more = tokens(item), other_bytes(item)
        if batch and (len(batch) == MAX_BATCH or used + n > max_tokens or extra + more > _BATCH_BYTES):
            batches.append(batch)
            batch, used, extra = [], 0, 0
        batch.append(item)
        used, extra = used + n, extra + more
    return batches + [batch] if batch else batches


def _numbers(buf, dtype: str, name: str, count: int | None = None) -> np.ndarray:
    size = np.dtype(dtype).itemsize
    if len(buf) % size or (count is not None and len(buf) != count * size):
        raise FrameError(f"{name} of {len(buf)} bytes is not {'' if count is None else count} {size}-byte values")
    return np.frombuffer(buf, dtype=dtype)


def _one(batch: list, what: str):
    if len(batch) != 1:
        raise FrameError(f"a batch of {len(batch)} where one {what} was expected")
    return batch[0]
