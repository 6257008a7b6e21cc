"""Generation requests and completions many to a frame, and episodes encoded a batch at a time."""

import numpy as np
import pytest

from streams.messages import (
    MAX_BATCH, Completion, Packed, GenerationRequest, decode_completions, decode_requests, encode_completions, encode_requests,
    split_completions, split_requests,
)
from streams.schema import Columns, decode_table, encode_episodes, encode_table, trajectory_table
from streams.wire import FRAME_LIMITS, MAX_NEW_TOKENS, MAX_PROMPT_TOKENS, FrameError, Kind, encode_frame, pack, unpack


def test_a_batch_of_requests_and_one_of_completions_round_trip_exactly():
    requests = [GenerationRequest(7 + i << 40, "tcp://127.0.0.1:5", ["main", "main-v3"][i % 2], list(range(i + 1)),
                                  0.7 + i, 1 + i, i) for i in range(5)]
    assert decode_requests(encode_requests(requests)) == requests
    completions = [Completion(3, [1, 2], [-0.5, -0.25], [3, 4], True), Completion.refused(4, "too hot"),
                   Completion(5, [9], [-1.5], [0], False)]
    assert decode_completions(encode_completions(completions)) == completions


def test_a_batch_with_one_bad_request_is_refused_whole_and_says_why():
    body = unpack(encode_requests([GenerationRequest(1, "mem://a", "main", [1, 2]),
                                   GenerationRequest(2, "mem://a", "main", [3])]))
    with pytest.raises(FrameError, match="do not add up"):
        decode_requests(pack({**body, "lengths": b"\2\0\0\0\2\0\0\0"}))
    with pytest.raises(FrameError, match="negative token id"):
        decode_requests(pack({**body, "prompts": b"\1\0\0\0\1\0\0\0\xff\xff\xff\xff"}))
    with pytest.raises(FrameError, match="2 ids and 1 policy names"):
        decode_requests(pack({**body, "policies": ["main"]}))
    with pytest.raises(FrameError, match="out of range"):
        decode_requests(pack({**body, "max_tokens": b"\4\0\0\0\0\0\0\0"}))
    with pytest.raises(FrameError, match="a batch of 2"):
        GenerationRequest.from_body(pack(body))  # where one request is expected
    with pytest.raises(ValueError, match="one reply_to"):
        encode_requests([GenerationRequest(1, "mem://a", "main", [1]), GenerationRequest(2, "mem://b", "main", [1])])
    completions = unpack(encode_completions([Completion(1, [1], [0.0], [0], True)]))
    with pytest.raises(FrameError, match="finished flags"):
        decode_completions(pack({**completions, "finished": b""}))


def test_split_batches_each_fit_one_frame_of_their_kind():
    long = MAX_PROMPT_TOKENS // 3
    requests = [GenerationRequest(i, "mem://a", "main", [1] * long) for i in range(7)]
    batches = split_requests(requests)
    assert [len(b) for b in batches] == [3, 3, 1] and sum(batches, []) == requests
    for batch in batches:
        encode_frame(Kind.GENERATE, encode_requests(batch), "env", 0)  # within the limit: no FrameError
    many = [GenerationRequest(i, "mem://a", "main", [1]) for i in range(MAX_BATCH + 5)]
    batches = split_requests(many)
    assert len(batches) > 1 and sum(batches, []) == many
    for batch in batches:
        assert len(batch) <= MAX_BATCH
        encode_frame(Kind.GENERATE, encode_requests(batch), "env", 0)
    refused = [Completion.refused(i, "x" * 500) for i in range(200)]
    batches = split_completions(refused) + split_completions([Completion(1, [1] * MAX_NEW_TOKENS, [0.0] * MAX_NEW_TOKENS,
                                                                         [0] * MAX_NEW_TOKENS, False)] * 2)
    assert len(batches) > 3
    for batch in batches:
        assert len(encode_frame(Kind.COMPLETION, encode_completions(batch), "rollout", 0)[1]) <= \
            FRAME_LIMITS[Kind.COMPLETION]


def _row(episode: int, turn: int) -> dict:
    return {Columns.EPISODE_ID: f"e{episode}", Columns.ENV_NAME: "gem:x", Columns.SEED: episode, Columns.TURN: turn,
            Columns.AGENT: 0, Columns.MATCHUP: "main", Columns.POLICY_ID: "main",
            Columns.PROMPT_IDS: list(range(episode + turn + 1)), Columns.ACTION_IDS: [5, 6],
            Columns.ACTION_TEXT: "[5]" * episode, Columns.BEHAVIOUR_LOGPROBS: [-0.5, -1.0],
            Columns.POLICY_VERSIONS: [episode, episode], Columns.REWARD: float(turn), Columns.TERMINATED: turn == 2,
            Columns.TRUNCATED: False, Columns.EPISODE_RETURN: 1.0, Columns.INVALID_ACTION: False,
            Columns.CREATED_AT: 1.0, Columns.GENERATED_AT: 2.0, Columns.SCORED_AT: 0.0}


def test_episodes_encoded_a_batch_at_a_time_decode_as_each_encoded_alone():
    episodes = [[_row(e, t) for t in range(1 + e % 3)] for e in range(6)]
    bodies = encode_episodes(episodes)
    assert len(bodies) == 6
    for rows, body in zip(episodes, bodies):
        assert decode_table(body).equals(decode_table(encode_table(trajectory_table(rows))))
        assert decode_table(body).column(Columns.EPISODE_ID).to_pylist() == [rows[0][Columns.EPISODE_ID]] * len(rows)


def test_packed_numbers_make_the_same_frames_and_columns_as_plain_lists():
    prompt = Packed.of([5, 300, 7], np.asarray([5, 300, 7], "<i4").tobytes())
    assert prompt == [5, 300, 7] and type(prompt[1:]) is list  # a list like any other; a slice is a plain one
    plain = GenerationRequest(1, "mem://a", "main", [5, 300, 7])
    assert encode_requests([GenerationRequest(1, "mem://a", "main", prompt)]) == encode_requests([plain])
    logprobs = Packed.of([-0.5, -1.0], np.asarray([-0.5, -1.0], "<f4").tobytes())
    stale = Packed.of([1, 2], b"\0" * 4)  # its bytes say less than its list: ignored
    rows = [{**_row(0, 0), Columns.PROMPT_IDS: prompt, Columns.BEHAVIOUR_LOGPROBS: logprobs,
             Columns.POLICY_VERSIONS: stale}, {**_row(1, 1), Columns.BEHAVIOUR_LOGPROBS: Packed.of([0.5], b"\0\0\0?")}]
    plain_rows = [{name: list(value) if isinstance(value, list) else value for name, value in row.items()}
                  for row in rows]
    assert trajectory_table(rows).equals(trajectory_table(plain_rows))
    assert trajectory_table(rows).column(Columns.POLICY_VERSIONS).to_pylist() == [[1, 2], [1, 1]]
