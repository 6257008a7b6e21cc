"""Losses: pure functions over tensors that return ``(loss, stats)``."""

from __future__ import annotations

import torch


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log p(target) under softmax(logits / temperature); logits [..., V], targets [...]."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def sft_loss(logits: torch.Tensor, input_ids: torch.Tensor, target_mask: torch.Tensor):
    """Next-token cross-entropy on the positions where ``target_mask`` is set.

    logits [B, T, V] predict input_ids shifted by one; target_mask [B, T] marks the tokens to learn.
    """
    logp = token_logprobs(logits[:, :-1], input_ids[:, 1:])
    mask = target_mask[:, 1:]
    loss = -masked_mean(logp, mask)
    return loss, {"sft_loss": loss.item(), "tokens": int(mask.sum())}


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float = 0.2,
):
    """Token-level PPO-clip (Schulman et al. 2017, eq. 7), averaged over the tokens in ``mask``.

    L = -E_t[min(r_t A_t, clip(r_t, 1-eps, 1+eps) A_t)],  r_t = exp(logp_t - old_logp_t).
    Here ``old_logprobs`` are the behaviour log-probs recorded by the engine that sampled the tokens.
    All tensors have the same shape [B, T]; advantages are already broadcast to tokens.
    """
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    loss = -masked_mean(torch.minimum(unclipped, clipped), mask)
    with torch.no_grad():
        clip_fraction = masked_mean(((ratio - 1.0).abs() > clip_eps).float(), mask)
        approx_kl = masked_mean(old_logprobs - logprobs, mask)
    stats = {
        "pg_loss": loss.item(),
        "clip_fraction": clip_fraction.item(),
        "approx_kl": approx_kl.item(),
        "ratio_mean": masked_mean(ratio.detach(), mask).item(),
    }
    return loss, stats


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor):
    """KL(pi_theta || pi_ref) per token with the k3 estimator (Schulman, "Approximating KL divergence", 2020).

    k3 = exp(ref - logp) - (ref - logp) - 1 is unbiased for samples from pi_theta and never negative.
    Keeping a self-play policy near its reference keeps its play diverse.
    """
    delta = ref_logprobs - logprobs
    kl = masked_mean(torch.exp(delta) - delta - 1.0, mask)
    return kl, {"kl_ref": kl.item()}
