"""A masked token contributes nothing to a loss or its gradient, not even a NaN (``inf * 0`` was NaN); on finite
inputs every loss gives what a plain multiply-by-mask implementation gives."""

import math

import pytest
import torch

from algos.losses import (decoupled_ppo_loss, kl_cost_to_go, kl_penalty, masked_mean, ppo_clip_loss, reinforce_loss,
                          truncated_is_loss)

MASK = torch.tensor([[True, False, True]])


def reference_masked_mean(x, mask):
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def reference_ppo(logprobs, old, advantages, mask, eps=0.2):
    ratio = torch.exp(logprobs - old)
    surrogate = torch.minimum(ratio * advantages, torch.clamp(ratio, 1 - eps, 1 + eps) * advantages)
    return -reference_masked_mean(surrogate, mask)


def test_masked_mean_ignores_what_is_masked_even_infinite():
    x = torch.tensor([[1.0, math.inf, 3.0]])
    assert masked_mean(x, MASK).item() == 2.0
    assert math.isnan(reference_masked_mean(x, MASK).item())  # what it was: inf * 0
    weighted = torch.tensor([[0.5, 0.0, 2.0]])  # a weighted mask keeps its weights
    assert masked_mean(torch.tensor([[2.0, math.nan, 1.0]]), weighted).item() == pytest.approx(3.0 / 2.5)


def test_on_finite_inputs_the_losses_are_unchanged():
    torch.manual_seed(0)
    for _ in range(10):
        logprobs = (torch.randn(4, 6) - 1).requires_grad_()
        old, adv, mask = logprobs.detach() + 0.3 * torch.randn(4, 6), torch.randn(4, 6), torch.rand(4, 6) > 0.3
        loss, _ = ppo_clip_loss(logprobs, old, adv, mask)
        (grad,) = torch.autograd.grad(loss, logprobs)
        expected = reference_ppo(logprobs, old, adv, mask)
        (expected_grad,) = torch.autograd.grad(expected, logprobs)
        assert torch.equal(loss, expected) and torch.equal(grad, expected_grad)


@pytest.mark.parametrize("name", ["ppo", "decoupled_ppo", "truncated_is", "reinforce", "kl"])
def test_an_overflowing_masked_token_leaves_loss_and_gradient_finite(name):
    # token 1 is masked, and its log-prob is absurd: a ratio of e^1000 (inf), a log-prob of -inf
    logprobs = torch.tensor([[-1.0, 1000.0, -2.0]], requires_grad=True)
    behaviour = torch.tensor([[-1.2, -math.inf, -2.1]])
    advantages = torch.tensor([[1.0, -1.0, 0.5]])
    losses = {
        "ppo": lambda: ppo_clip_loss(logprobs, behaviour, advantages, MASK)[0],
        "decoupled_ppo": lambda: decoupled_ppo_loss(logprobs, logprobs.detach() - torch.tensor([[0.0, 2000.0, 0.0]]),
                                                    behaviour, advantages, MASK, out_of_range="clamp")[0],
        "truncated_is": lambda: truncated_is_loss(torch.where(MASK, logprobs, -math.inf), behaviour, advantages,
                                                  MASK)[0],
        "reinforce": lambda: reinforce_loss(torch.where(MASK, logprobs, -math.inf), advantages, MASK)[0],
        "kl": lambda: kl_penalty(logprobs, behaviour, MASK)[0],
    }
    loss = losses[name]()
    (grad,) = torch.autograd.grad(loss, logprobs)
    assert math.isfinite(loss.item()) and torch.isfinite(grad).all()
    assert grad[0, 1] == 0  # the masked token: nothing at all


def test_kl_cost_to_go_ignores_masked_infinities():
    proximal = torch.tensor([[-1.0, math.inf, -2.0]])
    cost, stats = kl_cost_to_go(proximal, torch.tensor([[-1.5, 0.0, -1.0]]), MASK)
    assert torch.equal(cost, torch.tensor([[-0.5, 0.0, -1.0]])) and stats["kl_ref"] == pytest.approx(-0.25)
