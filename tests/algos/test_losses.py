import math

import torch

from algos.advantages import grpo_advantages
from algos.losses import kl_cost_to_go, kl_penalty, ppo_clip_loss, sft_loss, token_logprobs


def test_ppo_clip_matches_hand_computed_values():
    # ratios e^0.1 = 1.105 (inside the clip range), e^0.5 = 1.649 (clipped at 1.2 for A > 0),
    # e^-0.5 = 0.607 with A < 0: min(0.607 * -1, 0.8 * -1) = -0.8.
    logp = torch.tensor([[0.1, 0.5, -0.5]])
    old = torch.zeros(1, 3)
    adv = torch.tensor([[1.0, 2.0, -1.0]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    loss, stats = ppo_clip_loss(logp, old, adv, mask, clip_eps=0.2)
    expected = -(math.exp(0.1) * 1.0 + 1.2 * 2.0 + 0.8 * -1.0) / 3
    assert math.isclose(loss.item(), expected, rel_tol=1e-6)
    assert math.isclose(stats["clip_fraction"], 2 / 3, rel_tol=1e-6)


def test_masked_tokens_contribute_nothing():
    logp = torch.tensor([[0.0, 3.0]], requires_grad=True)
    loss, _ = ppo_clip_loss(logp, torch.zeros(1, 2), torch.ones(1, 2), torch.tensor([[True, False]]))
    loss.backward()
    assert logp.grad[0, 1] == 0 and logp.grad[0, 0] != 0
    assert math.isclose(loss.item(), -1.0)


def test_on_policy_gradient_is_the_policy_gradient():
    # With logp == old, d/dlogp of -ratio*A is -A: PPO starts as REINFORCE.
    logp = torch.zeros(1, 2, requires_grad=True)
    adv = torch.tensor([[0.5, -2.0]])
    loss, _ = ppo_clip_loss(logp, logp.detach(), adv, torch.ones(1, 2, dtype=torch.bool))
    loss.backward()
    assert torch.allclose(logp.grad, -adv / 2)


def test_token_logprobs_with_temperature():
    logits = torch.tensor([[2.0, 0.0]])
    lp = token_logprobs(logits, torch.tensor([0]), temperature=2.0)
    assert math.isclose(lp.item(), 1.0 - math.log(math.exp(1.0) + 1.0), rel_tol=1e-6)


def test_sft_loss_counts_only_target_positions():
    logits = torch.zeros(1, 3, 4)  # uniform: every target costs log 4
    ids = torch.tensor([[1, 2, 3]])
    loss, stats = sft_loss(logits, ids, torch.tensor([[False, False, True]]))
    assert math.isclose(loss.item(), math.log(4), rel_tol=1e-6) and stats["tokens"] == 1


def test_group_baseline_removes_each_groups_mean():
    returns = torch.tensor([1.0, 1.0, -1.0, 0.0, 0.0, 1.0])
    seats = torch.tensor([0, 0, 0, 1, 1, 1])
    adv, stats = grpo_advantages(returns, seats, scale_by_std=False)
    assert torch.allclose(adv, torch.tensor([2 / 3, 2 / 3, -4 / 3, -1 / 3, -1 / 3, 2 / 3]))
    assert math.isclose(stats["return_group0"], 1 / 3, rel_tol=1e-6)
    normed, _ = grpo_advantages(returns, seats)
    assert torch.allclose(normed[seats == 1].std(), torch.tensor(1.0), atol=1e-4)


def test_kl_penalty_is_zero_at_the_reference_and_positive_away_from_it():
    logp = torch.log(torch.tensor([[0.5, 0.25]]))
    mask = torch.ones(1, 2, dtype=torch.bool)
    zero, _ = kl_penalty(logp, logp, mask)
    assert zero.item() == 0.0
    ref = torch.log(torch.tensor([[0.25, 0.5]]))
    kl, stats = kl_penalty(logp, ref, mask)
    # k3 per token: exp(d) - d - 1 with d = ref - logp = (-log 2, log 2)
    expected = ((0.5 + math.log(2) - 1) + (2 - math.log(2) - 1)) / 2
    assert math.isclose(kl.item(), expected, rel_tol=1e-6) and stats["kl_ref"] > 0


def test_kl_cost_to_go_sums_the_rest_of_each_rows_action():
    proximal = torch.tensor([[0.0, -1.0, -2.0, -3.0], [-1.0, -1.0, -1.0, 0.0]])
    ref = torch.tensor([[5.0, -2.0, -2.5, -3.0], [-1.5, -0.5, -1.0, 9.0]])
    mask = torch.tensor([[False, True, True, True], [True, True, True, False]])
    cost, stats = kl_cost_to_go(proximal, ref, mask)
    # per token log pi - log ref: row 0 (masked, 1, 0.5, 0), row 1 (0.5, -0.5, 0, masked)
    assert torch.allclose(cost, torch.tensor([[0.0, 1.5, 0.5, 0.0], [0.0, -0.5, 0.0, 0.0]]))
    assert math.isclose(stats["kl_ref"], 1.5 / 6, rel_tol=1e-6)
