"""A learner group: two gloo ranks with FSDP2 train like one, and their checkpoints load on any rank count."""


import dataclasses
import math

import pytest

from actors.learner import local_group
from actors.models.base_model import load_policy
from actors.learner.actor import LearnerConfig
from actors.learner.update import Objective
from tests.factories import largest_difference, random_table as table

# How far apart two groups that trained alike may end: the L2 distance between their weights (every tensor
# together), in Adam steps (lr). Not entry by entry: one rank and FSDP's reduction of two ranks' halves sum the
# gradients in another order, so they differ at float32's rounding (relative 3e-7 at the first step), and an
# entry whose gradient is itself at that noise floor (|g| and Adam's sqrt(v) ~ 1e-8..1e-7, e.g. the embedding row
# of a token seen once) still gets a step of order lr, whose size the rounding sets. Measured on the tiny model
# (8 steps, lr 1e-3): the largest entry 1.09e-4 (0.11 lr) apart, 4 of 399k entries more than 1e-5 apart, all in
# the token embedding and set apart at a step where their gradient was at that floor; distance 1.3e-4 (0.13 lr);
# in float64 (compute and reduction) the runs end 1e-15 apart. A real divergence moves most entries by several
# steps: one rank's loss scaled by 1.01 gives a distance of 0.036 (36 lr), by 1.1 0.14, one rank's rows dropped
# 2.7, the gradients not scaled by the rank count 0.53.
APART_IN_STEPS = 2.0


def distance(a: dict, b: dict) -> float:
    """The L2 distance between two state dicts' weights (same keys), over every tensor together."""
    assert a.keys() == b.keys()
    return math.sqrt(sum(float((a[k].double() - b[k].double()).square().sum()) for k in a))


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
    # ... and both groups the same way: the weights (APART_IN_STEPS), and the gradients before Adam normalises them
    # (the last update's mean gradient norm: relative 7e-6 apart; one rank's loss scaled by 1.01: 1.7%)
    assert distance(one["weights"], two["weights"]) <= APART_IN_STEPS * cfg.lr
    assert two["stats"][-1]["grad_norm"] == pytest.approx(one["stats"][-1]["grad_norm"], rel=1e-3)
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
    assert distance(on_one["weights"], one["weights"]) <= APART_IN_STEPS * cfg.lr
    assert distance(on_two["weights"], one["weights"]) <= APART_IN_STEPS * cfg.lr


def test_a_group_goes_back_to_its_anchor_together(group_setup):
    """The guard's rollback in a learner group: every rank holds its shards of the anchor and restores them."""
    cfg, (first, second) = group_setup
    anchored = local_group.train(cfg, 2, [first])
    rolled_back = local_group.train(cfg, 2, [first, second], anchor_after=1)
    assert largest_difference(rolled_back["weights"], anchored["weights"]) <= 1e-6
    assert rolled_back["optimizer_steps"] == 0  # a fresh optimizer: the moments belonged to what was undone


def test_in_a_group_the_reference_computes_as_the_sharded_policy_does(group_setup):
    """Two ranks computing in bf16 (FSDP's mixed precision): the reference model is sharded with the same policy,
    so before the first step its log-probs are the policy's and the KL term is zero, as on one rank (where both
    run under autocast). An unsharded fp32 reference gave a KL of 2.4e-4 at step 0 on the tiny model, and a gradient from it."""
    cfg, (first, _) = group_setup
    anchored = dataclasses.replace(cfg, dtype="bf16", objective=Objective(kl_coef=0.5, minibatches=1))
    for world in (1, 2):
        stats = local_group.train(anchored, world, [first])["stats"][0]
        assert stats["kl_ref"] == 0.0, (world, stats["kl_ref"])
