"""Well-typed poison: every row is checked before anything keeps it; a bad row is counted by reason, the rest go on."""

import logging
import math

import pytest

from streams.messages import GenerationRequest
from streams.schema import Columns as C
from streams.schema import decode_table, encode_table, trajectory_table
from streams.values import MAX_LOGPROB, REASONS, Rejections, RequestChecks, check_rows, within_context
from tests.factories import POISON, row



def decoded(rows: list[dict]):
    """As a receiver sees them: through the wire format."""
    return decode_table(encode_table(trajectory_table(rows)))


def test_an_honest_table_passes_whole():
    table = decoded([row(turn=0), row(turn=1)])
    checked = check_rows(table, vocab_size=100, max_version=3, one_episode=True)
    assert checked.table.equals(table) and checked.rejected == {} and checked.rejected_rows == 0


@pytest.mark.parametrize("reason", sorted(POISON))
def test_each_kind_of_poison_is_refused_and_the_rest_of_the_table_goes_on(reason):
    poison = {**POISON[reason], C.TURN: 1}
    table = decoded([row(turn=0), poison, row(turn=2)])
    checked = check_rows(table, vocab_size=100, max_version=10)
    assert checked.rejected == {reason: 1}
    assert checked.table.column(C.TURN).to_pylist() == [0, 2]
    assert reason in checked.example and "row 1" in checked.example


@pytest.mark.parametrize("column, value", [(C.EPISODE_RETURN, math.inf), (C.CREATED_AT, -math.inf),
                                           (C.SCORED_AT, math.nan), (C.BEHAVIOUR_LOGPROBS, [-0.5, math.nan]),
                                           (C.BEHAVIOUR_LOGPROBS, [-math.inf, -0.5])])
def test_every_float_is_finite(column, value):
    checked = check_rows(decoded([row(), row(turn=1, **{column: value})]))
    assert checked.rejected == {"non_finite": 1} and checked.table.num_rows == 1


def test_rows_beyond_the_context_or_the_reward_bound_are_refused_where_the_checker_knows_them():
    """A row of 16 k tokens stalled the learner for hours, and a finite reward of 3e38 skipped ~200 updates; both
    passed the checks, which knew no bound on either."""
    table = decoded([row(), row(turn=1, **{C.PROMPT_IDS: [3] * 62}), row(turn=2, **{C.PROMPT_IDS: [3] * 63}),
                     row(turn=3, **{C.REWARD: -3e38}), row(turn=4, **{C.EPISODE_RETURN: 1000.5}),
                     row(turn=5, **{C.REWARD: -1000.0, C.EPISODE_RETURN: 1000.0})])
    assert check_rows(table).rejected == {}  # nothing known: neither is checked
    checked = check_rows(table, max_tokens=64, max_abs=1000.0)
    assert checked.rejected == {"too_long": 1, "magnitude": 2}
    assert checked.table.column(C.TURN).to_pylist() == [0, 1, 5]  # 62 + 2 tokens, and +-1000 itself, pass
    alone = within_context(table, 64)
    assert alone.rejected == {"too_long": 1} and alone.table.num_rows == 5 and "65 tokens" in alone.example
    assert within_context(table, 65).table.equals(table)


def test_a_behaviour_log_prob_above_zero_is_refused_beyond_rounding():
    table = decoded([row(**{C.BEHAVIOUR_LOGPROBS: [0.0, MAX_LOGPROB]}),
                     row(turn=1, **{C.BEHAVIOUR_LOGPROBS: [-1.0, 0.01]})])
    checked = check_rows(table)
    assert checked.rejected == {"logprob": 1} and checked.table.column(C.TURN).to_pylist() == [0]


def test_null_elements_inside_lists_and_null_scalars_are_refused():
    table = decoded([row(), row(turn=1, **{C.ACTION_IDS: [6, None]}), row(turn=2, **{C.SEED: None}),
                     row(turn=3, **{C.PROMPT_IDS: None})])
    checked = check_rows(table)
    assert checked.rejected == {"null": 3} and checked.table.num_rows == 1


def test_versions_and_token_ids_against_what_the_checker_knows():
    table = decoded([row(**{C.POLICY_VERSIONS: [2, 2**31 - 1]}), row(turn=1, **{C.PROMPT_IDS: [10**6]})])
    assert check_rows(table).rejected == {}  # nothing known: only the sign is checked
    assert check_rows(table, max_version=5, vocab_size=100).rejected == {"version": 1, "token_id": 1}
    assert check_rows(decoded([row(**{C.PROMPT_IDS: [99]})]), vocab_size=100).rejected == {}  # the last id is in


def test_ids_are_unique_and_one_episode_is_one_episode():
    table = decoded([row(turn=0), row(turn=0), row(turn=1), row(episode="other", turn=2)])
    assert check_rows(table).rejected == {"duplicate_row": 1}
    one = check_rows(table, one_episode=True)
    assert one.rejected == {"duplicate_row": 1, "other_episode": 1}
    assert set(one.table.column(C.EPISODE_ID).to_pylist()) == {"env-0-1"}
    # a bad first row does not decide the episode's id: the first good one does
    led = check_rows(decoded([row(**{C.EPISODE_ID: None}), row(episode="e-1", turn=1)]), one_episode=True)
    assert led.rejected == {"null": 1} and led.table.num_rows == 1


def test_a_row_counts_once_under_its_first_reason():
    bad = row(**{C.EPISODE_ID: None, C.REWARD: math.nan, C.POLICY_VERSIONS: [-1, -1]})
    assert check_rows(decoded([bad])).rejected == {"null": 1}
    assert REASONS.index("null") < REASONS.index("non_finite") < REASONS.index("version")


def test_rejections_are_counted_in_full_and_logged_at_a_bounded_rate(caplog):
    rejected = Rejections("replay: episode rows", every_s=3600.0)
    with caplog.at_level(logging.WARNING, logger="streams.values"):
        for _ in range(50):
            rejected.add({"null": 1, "ragged": 2}, "row 0: null")
    assert rejected.counts == {"null": 50, "ragged": 100} and rejected.total() == 150
    lines = [r for r in caplog.records if "replay: episode rows" in r.getMessage()]
    assert len(lines) == 1 and "null" in lines[0].getMessage()


def test_a_generation_request_outside_the_vocabulary_or_with_a_negative_version_is_refused():
    checks = RequestChecks("rollout-0")
    assert checks.refusal(GenerationRequest(1, "tcp://127.0.0.1:5", "main", [1, 99]), 100) == ""
    assert "outside the vocabulary" in checks.refusal(GenerationRequest(2, "tcp://127.0.0.1:5", "main", [100]), 100)
    assert "negative" in checks.refusal(GenerationRequest(3, "tcp://127.0.0.1:5", "main", [1], min_version=-2), 100)
    assert checks.statistics() == {"rejected_requests": 2, "rejected_by_reason": {"token_id": 1, "version": 1}}
