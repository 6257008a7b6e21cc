"""Well-typed rows that once stopped the learner: a batch whose rows hold no action token crashed `_update` (and its
restart got the same batch again from replay: a crash loop), and a row longer than the model's context was trained
(an update grows with the square of a row's length: one row of 16 k tokens took 11.7 s on the tiny model)."""

import pytest

from actors.learner.actor import LearnerActor, LearnerConfig
from streams.schema import Columns as C
from streams.schema import trajectory_table
from tests.factories import row

HONEST = {C.POLICY_VERSIONS: [0, 0], C.SCORED_AT: 0.0}


@pytest.fixture(scope="module")
def learner(tiny_model_dir):
    learner = LearnerActor(LearnerConfig(model_path=str(tiny_model_dir), device="cpu"))
    learner.trainer.load(None)
    return learner


def test_a_batch_of_rows_without_action_tokens_is_refused_and_survived(learner):
    empty = {C.ACTION_IDS: [], C.BEHAVIOUR_LOGPROBS: [], C.POLICY_VERSIONS: []}
    table = trajectory_table([row(f"env-0-{i}", **empty) for i in range(8)])
    version = learner.version
    stats = learner._update(table)
    assert stats["tokens"] == 0 and stats["rejected_by_reason"] == {"no_action": 8}
    assert stats["version"] == learner.version == version + 1  # consumed: replay's next batch follows
    assert "staleness_max" not in stats  # no token to say it of


def test_a_row_longer_than_the_models_context_is_refused_and_the_rest_trained(learner):
    context = learner.trainer.model.config.max_position_embeddings
    table = trajectory_table([row("env-0-1", **HONEST), row("env-0-2", **HONEST),
                              row("env-0-3", **{**HONEST, C.PROMPT_IDS: [3] * (context - 1)}),  # 1 token over
                              row("env-0-4", **{**HONEST, C.PROMPT_IDS: [3] * (context - 2)})])  # the context
    stats = learner._update(table)
    assert stats["rejected_by_reason"] == {"too_long": 1} and stats["rejected_rows"] == 1
    assert stats["tokens"] == 3 * 2  # the other three rows' action tokens
