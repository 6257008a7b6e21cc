"""A learner group: two gloo ranks with FSDP2 train like one, and their checkpoints load on any rank count."""


import pytest

from actors.learner import local_group
from actors.models.base_model import load_policy
from actors.learner.actor import LearnerConfig
from tests.factories import largest_difference, random_table as table



@pytest.fixture(scope="module")
def group_setup(tiny_model_dir):
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(tiny_model_dir).vocab_size
    cfg = LearnerConfig(model_path=str(tiny_model_dir), lr=1e-3, device="cpu", seed=3)
    return cfg, [table(s, vocab) for s in range(2)]


def test_two_gloo_ranks_train_as_one_with_half_the_state_each_and_checkpoints_load_on_either_count(group_setup,
                                                                                                    tmp_path):
    cfg, (first, second) = group_setup
    # each also leaves a checkpoint after its first update
    one = local_group.train(cfg, 1, [first, second], save_to=tmp_path / "dp1", save_after=1)
    two = local_group.train(cfg, 2, [first, second], save_to=tmp_path / "dp2", save_after=1)
    base = {name: p for name, p in load_policy(cfg.model_path)[0].named_parameters()}
    assert largest_difference(one["weights"], base) > 1e-3  # the updates moved the weights ...
    assert largest_difference(one["weights"], two["weights"]) <= 1e-4  # ... and both groups the same way
    assert two["stats"][-1]["tokens"] == one["stats"][-1]["tokens"]
    assert two["stats"][-1]["pg_loss"] == pytest.approx(one["stats"][-1]["pg_loss"], abs=1e-4)
    for kind in ("param_bytes", "optimizer_bytes"):
        per_rank = [m[kind] for m in two["memory"]]
        assert max(per_rank) <= 0.6 * one["memory"][0][kind], (kind, per_rank, one["memory"][0][kind])

    # the second update from each checkpoint, on the other rank count
    assert (tmp_path / "dp2" / "optimizer").is_dir() and (tmp_path / "dp2" / "config.json").exists()
    on_one = local_group.train(cfg, 1, [first, second], checkpoint=tmp_path / "dp2", resume_versions=1)
    on_two = local_group.train(cfg, 2, [first, second], checkpoint=tmp_path / "dp1", resume_versions=1)
    assert on_one["optimizer_steps"] == on_two["optimizer_steps"] == one["optimizer_steps"]
    assert largest_difference(on_one["weights"], one["weights"]) <= 1e-4
    assert largest_difference(on_two["weights"], one["weights"]) <= 1e-4


def test_a_group_goes_back_to_its_anchor_together(group_setup):
    """The guard's rollback in a learner group: every rank holds its shards of the anchor and restores them."""
    cfg, (first, second) = group_setup
    anchored = local_group.train(cfg, 2, [first])
    rolled_back = local_group.train(cfg, 2, [first, second], anchor_after=1)
    assert largest_difference(rolled_back["weights"], anchored["weights"]) <= 1e-6
    assert rolled_back["optimizer_steps"] == 0  # a fresh optimizer: the moments belonged to what was undone
