"""Bodies of the right kind in the wrong shape, and frames whose parts are too large together: refused, not built."""

import pytest

from streams.messages import (
    MAX_BATCH, Completion, GenerationRequest, MatchAssigned, MatchRequest, MatchResult, ScaleAnswered, ScaleRequest,
    VersionAnnounced, WeightsChunk, WeightsFetch, WeightsManifest,
)
from streams.wire import FRAME_LIMITS, MAX_PROMPT_TOKENS, FrameError, Kind, decode_frame, encode_frame, pack, unpack

EXAMPLES = [
    GenerationRequest(1, "tcp://127.0.0.1:9", "main", [1, 2, 3], 1.0, 4),
    Completion(1, [5], [-0.5], [0], True),
    WeightsManifest("main", 9, 10, 4, [0, 0, 0], "h", "/nowhere", "tcp://127.0.0.1:9"),
    WeightsFetch("main", 0, 0, "tcp://127.0.0.1:9"),
    WeightsChunk("main", 0, 0, b"data"),
    VersionAnnounced("main", 3),
    ScaleRequest("rollout", 2),
    ScaleAnswered(True, "ok", 2),
    MatchRequest(1, "tcp://127.0.0.1:9", ["main"]),
    MatchAssigned(1, 2, "main", ["main", "random"]),
    MatchResult(2, "main", ["main", "random"], [1.0, -1.0]),
]
WRONG_SHAPES = {  # an extra field that an honest message never holds, each far past its kind's shape
    "an array of 100 k empty arrays": [[]] * 100_000,
    "a map of 10 k entries": {str(i): i for i in range(10_000)},
    "a string of 100 k characters": "x" * 100_000,
    "bytes of 17 MiB": b"\0" * (17 * 2**20),  # past the largest, a weights chunk's
}


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
@pytest.mark.parametrize("extra", WRONG_SHAPES, ids=lambda name: name)
def test_each_message_refuses_a_body_of_the_wrong_shape_before_building_it(message, extra):
    fields = unpack(message.to_body())
    fields["extra"] = WRONG_SHAPES[extra]
    with pytest.raises(FrameError, match="exceeds max_|not valid msgpack"):
        type(message).from_body(pack(fields))
    assert type(message).from_body(message.to_body()) == message  # the honest one still passes


@pytest.mark.parametrize("field, value", [("prompts", b"\1\0\0\0" * (MAX_PROMPT_TOKENS + 1)),
                                          ("policies", ["p" * 5000]), ("prompts", [1, 2, 3]), ("reply_to", ["tcp://x"]),
                                          ("policies", ["main"] * (MAX_BATCH + 1)), ("lengths", b"\4\0\0\0")])
def test_a_generation_request_whose_fields_are_too_long_or_of_another_type_is_refused(field, value):
    fields = unpack(EXAMPLES[0].to_body())
    fields[field] = value
    with pytest.raises(FrameError):
        GenerationRequest.from_body(pack(fields))


def test_a_frame_counts_every_part_and_its_header_against_the_limit():
    half = FRAME_LIMITS[Kind.VERSION] // 2
    header = encode_frame(Kind.VERSION, b"", "learner", 0)[0]
    with pytest.raises(FrameError) as refused:
        decode_frame([header, b"\0" * half, b"\0" * half, b"\0" * half])
    assert refused.value.reason == "malformed"  # three parts; within MAX_FRAME_BYTES, so the count decides
    with pytest.raises(FrameError) as refused:
        decode_frame([header, b"\0" * (FRAME_LIMITS[Kind.VERSION] - len(header) + 1)])
    assert refused.value.reason == "oversized"
    with pytest.raises(FrameError, match="exceeds the limit"):  # the sender counts the header too
        encode_frame(Kind.VERSION, b"\0" * (FRAME_LIMITS[Kind.VERSION] - 1), "learner", 0)


def test_a_four_mib_request_is_over_its_kind_limit():
    assert FRAME_LIMITS[Kind.GENERATE] < 4 * 2**20
    honest = GenerationRequest(1, "tcp://127.0.0.1:9", "main", list(range(MAX_PROMPT_TOKENS)), 1.0, 4)
    header, body = encode_frame(Kind.GENERATE, honest.to_body(), "env", 0)  # the longest prompt fits
    assert GenerationRequest.from_body(decode_frame([header, body])[1]).prompt_ids == honest.prompt_ids
