"""A learner group agrees to skip a non-finite step: two gloo ranks, an infinite loss on one rank's rows only."""

import pytest
from transformers import AutoConfig

from actors.learner import local_group
from actors.models.base_model import load_policy
from actors.learner.actor import LearnerConfig
from actors.learner.update import Objective
from streams.schema import Columns as C
from streams.schema import trajectory_table
from tests.factories import largest_difference, random_table as table


@pytest.mark.timeout(600)
def test_two_ranks_both_skip_a_step_whose_loss_is_infinite_on_one_of_them(tiny_model_dir):
    rows = table(0, AutoConfig.from_pretrained(tiny_model_dir).vocab_size).to_pylist()
    # a finite but absurd behaviour log-prob: naive PPO's ratio overflows, and with a negative return the loss is
    # inf on the rank that trains this row (rows are dealt to the ranks by length): the other rank's is finite
    rows[5][C.BEHAVIOUR_LOGPROBS] = [-1e30] * len(rows[5][C.BEHAVIOUR_LOGPROBS])
    rows[5][C.REWARD] = rows[5][C.EPISODE_RETURN] = -1.0
    cfg = LearnerConfig(model_path=str(tiny_model_dir), lr=1e-3, device="cpu", seed=3,
                        objective=Objective(loss="ppo", minibatches=1))
    two = local_group.train(cfg, 2, [trajectory_table(rows)])
    assert two["stats"][0]["skipped_steps"] == 1 and two["optimizer_steps"] == 0
    base = {name: p for name, p in load_policy(cfg.model_path)[0].named_parameters()}
    assert largest_difference(two["weights"], base) == 0  # neither rank's shard moved
