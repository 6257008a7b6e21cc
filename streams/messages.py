"""The control messages of the data plane, as dataclasses with their msgpack bodies.

Token ids, log-probs and versions travel as raw little-endian arrays inside msgpack (PLATFORM.md: about
6x faster than msgpack lists). Field names are declared here once; actors never build these maps by hand.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from streams.wire import FrameError, pack, unpack

WEIGHTS_TOPIC = b"weights/"
VERSION_TOPIC = b"version/"


def _ints(values) -> bytes:
    return np.asarray(values, dtype="<i4").tobytes()


def _floats(values) -> bytes:
    return np.asarray(values, dtype="<f4").tobytes()


def _fields(body, names: tuple[str, ...], what: str) -> dict:
    fields = unpack(body)
    if not isinstance(fields, dict) or any(name not in fields for name in names):
        missing = [n for n in names if not isinstance(fields, dict) or n not in fields]
        raise FrameError(f"{what} message lacks {', '.join(missing)}")
    return fields


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

    NAMES = ("id", "reply_to", "policy", "prompt", "temperature", "max_tokens", "min_version")

    def to_body(self) -> bytes:
        values = (self.request_id, self.reply_to, self.policy_id, _ints(self.prompt_ids),
                  self.temperature, self.max_tokens, self.min_version)
        return pack(dict(zip(self.NAMES, values)))

    @classmethod
    def from_body(cls, body) -> GenerationRequest:
        f = _fields(body, cls.NAMES, "generation request")
        prompt = np.frombuffer(f["prompt"], dtype="<i4").tolist()
        if not prompt:
            raise FrameError("generation request with an empty prompt")
        return cls(f["id"], f["reply_to"], f["policy"], prompt, float(f["temperature"]), int(f["max_tokens"]),
                   int(f["min_version"]))


@dataclass
class Completion:
    """Sampled tokens with, for every token, the behaviour log-prob and the policy version that made it."""

    request_id: int
    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finished: bool  # ended with EOS; False when cut at max_tokens

    NAMES = ("id", "tokens", "logprobs", "versions", "finished")

    def to_body(self) -> bytes:
        values = (self.request_id, _ints(self.token_ids), _floats(self.logprobs), _ints(self.versions),
                  self.finished)
        return pack(dict(zip(self.NAMES, values)))

    @classmethod
    def from_body(cls, body) -> Completion:
        f = _fields(body, cls.NAMES, "completion")
        tokens = np.frombuffer(f["tokens"], dtype="<i4").tolist()
        logprobs = np.frombuffer(f["logprobs"], dtype="<f4").tolist()
        versions = np.frombuffer(f["versions"], dtype="<i4").tolist()
        if not len(tokens) == len(logprobs) == len(versions):
            raise FrameError(f"completion with {len(tokens)} tokens, {len(logprobs)} log-probs, "
                             f"{len(versions)} versions")
        return cls(f["id"], tokens, logprobs, versions, bool(f["finished"]))


@dataclass
class Weights:
    """A policy's parameters at ``version``, as safetensors bytes (no pickle)."""

    policy_id: str
    version: int
    tensors: bytes

    NAMES = ("policy", "version", "tensors")

    def to_body(self) -> bytes:
        return pack(dict(zip(self.NAMES, (self.policy_id, self.version, self.tensors))))

    @classmethod
    def from_body(cls, body) -> Weights:
        f = _fields(body, cls.NAMES, "weights")
        return cls(f["policy"], int(f["version"]), bytes(f["tensors"]))


@dataclass
class VersionAnnounced:
    """The learner of ``policy_id`` is now at ``version``."""

    policy_id: str
    version: int

    NAMES = ("policy", "version")

    def to_body(self) -> bytes:
        return pack(dict(zip(self.NAMES, (self.policy_id, self.version))))

    @classmethod
    def from_body(cls, body) -> VersionAnnounced:
        f = _fields(body, cls.NAMES, "version")
        return cls(f["policy"], int(f["version"]))
