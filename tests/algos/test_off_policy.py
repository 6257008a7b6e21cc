"""Advantage estimators and off-policy losses, against values computed by hand, and their invariants."""

import math

import pytest
import torch

from algos.advantages import (StateValues, discounted_returns, grpo_advantages, rae_advantages, rebn_advantages,
                              state_advantages)
from algos.losses import (decoupled_ppo_loss, entropy_bonus, ppo_clip_loss, reinforce_loss,
                          truncated_is_loss)

ALL = torch.ones(1, 3, dtype=torch.bool)


def test_discounted_returns_run_backwards_within_each_segment_whatever_the_row_order():
    # segment 0: turns 0, 1, 2 with rewards 0, 0, 1; segment 1: turns 0, 1 with rewards 1, -1. Rows shuffled.
    rewards = torch.tensor([1.0, 0.0, -1.0, 0.0, 1.0])
    segments = torch.tensor([0, 0, 1, 0, 1])
    turns = torch.tensor([2, 0, 1, 1, 0])
    returns = discounted_returns(rewards, segments, turns, gamma=0.5)
    # segment 0: G2 = 1, G1 = 0 + 0.5, G0 = 0.25;  segment 1: G1 = -1, G0 = 1 - 0.5 = 0.5
    assert torch.allclose(returns, torch.tensor([1.0, 0.25, -1.0, 0.5, 0.5]))
    undiscounted = discounted_returns(rewards, segments, turns, gamma=1.0)
    assert torch.allclose(undiscounted, torch.tensor([1.0, 1.0, -1.0, 1.0, 0.0]))
    with pytest.raises(ValueError, match="gamma"):
        discounted_returns(rewards, segments, turns, gamma=1.5)


def test_grpo_with_and_without_std_division():
    returns = torch.tensor([1.0, 0.0, 3.0, 3.0])
    groups = torch.tensor([0, 0, 1, 1])
    mean_only, _ = grpo_advantages(returns, groups, scale_by_std=False)
    assert torch.allclose(mean_only, torch.tensor([0.5, -0.5, 0.0, 0.0]))
    scaled, _ = grpo_advantages(returns, groups)
    # std of (1, 0) with Bessel's correction is 1/sqrt(2)
    assert torch.allclose(scaled[:2], torch.tensor([0.5, -0.5]) * math.sqrt(2), atol=1e-5)
    assert torch.all(scaled[2:] == 0)


def test_rebn_normalises_over_the_whole_batch():
    adv, stats = rebn_advantages(torch.tensor([1.0, 2.0, 3.0]))
    assert torch.allclose(adv, torch.tensor([-1.0, 0.0, 1.0]), atol=1e-5)
    assert stats["return_mean"] == 2.0


def test_rae_keeps_an_ema_baseline_per_role_updated_once_per_trajectory():
    returns = torch.tensor([1.0, 1.0, -1.0, 0.0])
    roles = torch.tensor([0, 0, 1, 1])
    baselines = {0: 0.0}
    adv, stats = rae_advantages(returns, roles, baselines, decay=0.9)
    # role 0 has two trajectories (rows): b = 0.9^2 * 0 + (1 - 0.81) * 1 = 0.19; role 1 is new: its batch mean
    assert baselines == {0: 0.0}
    assert stats["baselines"] == pytest.approx({0: 0.19, 1: -0.5})
    assert torch.allclose(adv, torch.tensor([0.81, 0.81, -0.5, 0.5]))
    # the same rows as one trajectory of role 0 (two turns of one episode): one update
    one, stats1 = rae_advantages(returns, roles, baselines, decay=0.9, segments=torch.tensor([0, 0, 1, 2]))
    assert stats1["baselines"][0] == pytest.approx(0.1) and torch.allclose(one[:2], torch.tensor([0.9, 0.9]))
    # a hundred trajectories move the baseline almost all the way to their mean
    many = torch.ones(100)
    _, stats2 = rae_advantages(many, torch.zeros(100, dtype=torch.long), {0: -1.0}, decay=0.9)
    assert stats2["baselines"][0] == pytest.approx(1.0 - 2 * 0.9**100)


def test_state_values_keep_an_exact_mean_until_the_window_fills_then_follow_recent_visits():
    values = StateValues(window=4, capacity=2)
    values.update("a", 2, 1.0)
    values.update("a", 2, 0.0)
    assert values.get("a") == (4, pytest.approx(0.5))  # the mean of four visits
    values.update("a", 2, 1.0)  # past the window: moves half-way (2 of 4 visits)
    assert values.get("a") == (4, pytest.approx(0.75))
    values.update("a", 8, -1.0)  # more visits than the window: replaced
    assert values.get("a") == (4, pytest.approx(-1.0))
    values.update("b", 1, 0.0)
    values.update("a", 1, -1.0)  # "a" seen last: "b" is the least recent
    values.update("c", 1, 0.0)
    assert len(values) == 2 and values.get("b") == (0, 0.0) and values.get("a")[0] == 4
    with pytest.raises(ValueError, match="window"):
        StateValues(window=0)


def test_state_advantages_credit_the_state_not_the_role_once_a_state_is_known():
    values = StateValues(window=64)
    roles = torch.zeros(4, dtype=torch.long)
    # first batch: nothing known, so the baseline is the role's (RAE): identical to rae_advantages
    returns = torch.tensor([1.0, 1.0, -1.0, -1.0])
    states = ["won", "won", "lost", "lost"]
    adv, stats = state_advantages(returns, roles, states, {0: 0.0}, values, prior=4.0, decay=0.9)
    rae, rae_stats = rae_advantages(returns, roles, {0: 0.0}, decay=0.9)
    assert torch.allclose(adv, rae) and stats["baselines"] == rae_stats["baselines"] and stats["states_known"] == 0
    assert values.get((0, "won")) == (2, pytest.approx(1.0))
    # the same returns again from the same states: the baseline leans towards each state's own mean
    adv2, stats2 = state_advantages(returns, roles, states, stats["baselines"], values, prior=2.0, decay=0.9)
    role_b = stats2["baselines"][0]
    # b(won) = (2 * 1 + 2 * role_b) / 4, so A(won) = 1 - b = (1 - role_b) / 2: half the RAE advantage
    assert adv2[0].item() == pytest.approx((1.0 - role_b) / 2)
    assert adv2[2].item() == pytest.approx((-1.0 - role_b) / 2)
    assert stats2["states_known"] == 1.0 and stats2["states_tracked"] == 2
    # a state seen many times is its own baseline: a return equal to its mean earns nothing
    for _ in range(20):
        state_advantages(returns, roles, states, stats2["baselines"], values, prior=2.0)
    adv3, _ = state_advantages(returns, roles, states, stats2["baselines"], values, prior=2.0)
    assert adv3.abs().max().item() < 0.05
    with pytest.raises(ValueError, match="prior"):
        state_advantages(returns, roles, states, {}, values, prior=0.0)


def test_decoupled_ppo_matches_hand_values():
    logp = torch.tensor([[0.1, 0.5, -0.5]])
    prox = torch.zeros(1, 3)
    behaviour = torch.tensor([[0.0, -math.log(2.0), -math.log(10.0)]])  # weights pi_prox/mu = 1, 2, 10
    adv = torch.tensor([[1.0, 2.0, -1.0]])
    loss, stats = decoupled_ppo_loss(logp, prox, behaviour, adv, ALL, clip_eps=0.2, weight_range=(0.0, 5.0))
    # token 3's weight 10 is outside [0, 5]: masked. Token 1: 1 * e^0.1 * 1; token 2: 2 * min(e^.5 * 2, 1.2 * 2)
    expected = -(math.exp(0.1) + 2 * 2.4 + 0.0) / 3
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert stats["is_outside_share"] == pytest.approx(1 / 3)
    clamped, cstats = decoupled_ppo_loss(logp, prox, behaviour, adv, ALL, weight_range=(0.0, 5.0), out_of_range="clamp")
    # token 3 now weighs 5: 5 * min(e^-.5 * -1, 0.8 * -1) = 5 * -0.8
    assert clamped.item() == pytest.approx(-(math.exp(0.1) + 4.8 - 4.0) / 3, rel=1e-6)
    with pytest.raises(ValueError, match="out_of_range"):
        decoupled_ppo_loss(logp, prox, behaviour, adv, ALL, out_of_range="drop")


def test_decoupled_ppo_equals_ppo_when_behaviour_is_proximal():
    torch.manual_seed(0)
    logp = torch.randn(4, 6, requires_grad=True)
    old = torch.randn(4, 6)
    adv = torch.randn(4, 6)
    mask = torch.rand(4, 6) > 0.3
    ppo, _ = ppo_clip_loss(logp, old, adv, mask)
    decoupled, stats = decoupled_ppo_loss(logp, old, old, adv, mask)
    assert torch.allclose(ppo, decoupled)
    (g1,) = torch.autograd.grad(ppo, logp)
    (g2,) = torch.autograd.grad(decoupled, logp)
    assert torch.allclose(g1, g2) and torch.isfinite(g2).all()
    assert stats["is_weight_mean"] == pytest.approx(1.0) and stats["is_outside_share"] == 0.0


@pytest.mark.parametrize("loss_fn", [
    lambda lp, mu, adv, m: decoupled_ppo_loss(lp, lp.detach(), mu, adv, m),
    lambda lp, mu, adv, m: ppo_clip_loss(lp, mu, adv, m),
    lambda lp, mu, adv, m: truncated_is_loss(lp, mu, adv, m),
    lambda lp, mu, adv, m: reinforce_loss(lp, adv, m),
])
def test_masked_tokens_contribute_nothing_and_gradients_are_finite(loss_fn):
    logp = torch.tensor([[-0.5, -1.0, -30.0]], requires_grad=True)
    behaviour = torch.tensor([[-0.7, -60.0, -0.1]])  # token 2 is wildly off-policy (weight e^59)
    adv = torch.tensor([[1.0, -1.0, 5.0]])
    mask = torch.tensor([[True, True, False]])
    loss, _ = loss_fn(logp, behaviour, adv, mask)
    loss.backward()
    assert logp.grad[0, 2] == 0 and torch.isfinite(logp.grad).all() and torch.isfinite(loss)
    changed = torch.tensor([[-0.5, -1.0, 7.0]], requires_grad=True)  # anything at the masked token
    again, _ = loss_fn(changed, behaviour, adv, mask)
    assert again.item() == pytest.approx(loss.item())


def test_truncated_is_caps_the_weight():
    logp = torch.tensor([[0.0, 0.0, 0.0]], requires_grad=True)
    behaviour = torch.tensor([[0.0, -math.log(4.0), math.log(2.0)]])  # rho = 1, 4 (capped to 2), 0.5
    adv = torch.tensor([[1.0, 1.0, 1.0]])
    loss, stats = truncated_is_loss(logp, behaviour, adv, ALL, cap=2.0)
    loss.backward()
    assert torch.allclose(logp.grad, -torch.tensor([[1.0, 2.0, 0.5]]) / 3)
    assert stats["is_outside_share"] == pytest.approx(1 / 3)


def test_reinforce_and_entropy_hand_values():
    logp = torch.log(torch.tensor([[0.5, 0.25, 1.0]]))
    loss, _ = reinforce_loss(logp, torch.tensor([[2.0, -1.0, 0.0]]), ALL)
    assert loss.item() == pytest.approx(-(2 * math.log(0.5) - math.log(0.25)) / 3)
    logits = torch.log(torch.tensor([[[0.5, 0.5], [1.0, 1e-9]]]))
    entropy, stats = entropy_bonus(logits, torch.tensor([[True, True]]))
    assert entropy.item() == pytest.approx(math.log(2) / 2, abs=1e-6)
