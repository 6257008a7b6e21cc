"""Losses: pure functions over tensors that return ``(loss, stats)``.

Shapes: every per-token tensor is [B, T] and ``mask`` marks the action tokens that count; a masked
token contributes nothing to the loss or its gradient, not even a NaN: masked positions are selected away with
``torch.where`` (``x * 0`` is NaN for an infinite x), before anything non-linear is computed from them, so that
no infinite intermediate meets a zero gradient there either. Log-probs are of the sampled tokens:
``logprobs`` under the policy being trained (pi_theta, with gradient), ``behaviour_logprobs`` recorded by
the engine that sampled them (mu), ``proximal_logprobs`` recomputed by the learner before the update
(pi_prox, no gradient). Advantages are already broadcast to tokens.

Statistics are 0-dim tensors, detached, on the loss's device: reading one (``float``, ``.item()``) waits for the
GPU, so a caller that adds up many micro-batches reads them all at once (``actors/learner/update.py``).

Log-probs and entropies are computed from the logits in fp32, block by block over the tokens
(``CHUNK_ELEMENTS``): at a vocabulary of 152k (Qwen2's) an fp32 copy of the logits is 0.6 MB a token, and the
upcast, the log-softmax and what autograd keeps of them would hold several such copies of a whole micro-batch.
"""

from __future__ import annotations

import functools

import torch
from torch.autograd.function import once_differentiable

# Logits a block of log-probs or entropies is computed from at once: 128 MiB as fp32, about 220 tokens at a
# vocabulary of 152k. Each fp32 temporary of a block (the upcast, the log-softmax, their gradients) is at most that;
# a block is large enough that a GPU's kernels run full, and a small model's logits are one block (computed as
# they always were).
CHUNK_ELEMENTS = 1 << 25


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log p(target) under softmax(logits / temperature), in fp32; logits [..., V], targets [...].

    The same values and gradients as ``log_softmax(logits.float() / temperature).gather(target)`` (they are that,
    block by block), with no fp32 copy of more than a block (``per_token``)."""
    return per_token(functools.partial(_target_logprobs, temperature=temperature), logits, targets)


def _target_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def _entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def per_token(fn, logits: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
    """``fn(logits, *inputs)`` for a function ``fn`` of each token's logits alone (logits [..., V], each of
    ``inputs`` [...], the result fp32 [...]), computed block by block where the logits are more than
    ``CHUNK_ELEMENTS``.

    Autograd would keep every fp32 intermediate of ``fn`` over the whole tensor for the backward pass; here the
    forward pass keeps only the logits themselves (the model's own tensor, alive anyway), and the backward pass
    computes each block again and writes its gradient into one tensor of the logits' shape and dtype (what the
    model's output layer needs). The cost is a second evaluation of ``fn``, elementwise work that is small beside
    the model's passes. Each block is ``fn`` exactly as over the whole tensor, so values and gradients are the same.
    """
    if logits.numel() <= CHUNK_ELEMENTS or logits.dim() < 2:
        return fn(logits, *inputs)
    tokens, vocab = logits.shape[-2:]
    grid = [logits.reshape(-1, tokens, vocab), *(x.reshape(-1, tokens) for x in inputs)]
    return _Blockwise.apply(fn, *grid).reshape(logits.shape[:-1])


def _blocks(rows: int, tokens: int, vocab: int) -> list[tuple[slice, slice]]:
    """(rows, tokens) slices covering a [rows, tokens, vocab] grid, each at most ``CHUNK_ELEMENTS`` logits (at least
    one token's): whole rows where a row fits, else a row's tokens in runs."""
    if tokens * vocab <= CHUNK_ELEMENTS:
        step = CHUNK_ELEMENTS // (tokens * vocab)
        return [(slice(r, r + step), slice(None)) for r in range(0, rows, step)]
    step = max(1, CHUNK_ELEMENTS // vocab)
    return [(slice(r, r + 1), slice(t, t + step)) for r in range(rows) for t in range(0, tokens, step)]


class _Blockwise(torch.autograd.Function):
    """``per_token``'s evaluation: forward without a graph, block by block; backward by recomputing each block."""

    @staticmethod
    def forward(ctx, fn, logits, *inputs):
        ctx.fn = fn
        ctx.save_for_backward(logits, *inputs)
        out = torch.empty(logits.shape[:-1], dtype=torch.float32, device=logits.device)
        for rows, tokens in _blocks(*logits.shape):
            out[rows, tokens] = fn(logits[rows, tokens], *(x[rows, tokens] for x in inputs))
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        logits, *inputs = ctx.saved_tensors
        grad_logits = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        for rows, tokens in _blocks(*logits.shape):
            with torch.enable_grad():
                block = logits[rows, tokens].detach().requires_grad_()
                value = ctx.fn(block, *(x[rows, tokens] for x in inputs))
            grad_logits[rows, tokens], = torch.autograd.grad(value, block, grad[rows, tokens])
        return None, grad_logits, *(None for _ in inputs)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    weights = mask.to(x.dtype)
    return torch.where(mask != 0, x * weights, 0.0).sum() / weights.sum().clamp(min=1.0)


def _kept(x: torch.Tensor, mask: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
    """``x`` where ``mask`` is set, ``fill`` elsewhere: what a masked position holds before it meets exp or a
    product, so that neither its value nor its gradient can be infinite or NaN."""
    return torch.where(mask != 0, x, fill)


def sft_loss(logits: torch.Tensor, input_ids: torch.Tensor, target_mask: torch.Tensor):
    """Next-token cross-entropy on the positions where ``target_mask`` is set.

    logits [B, T, V] predict input_ids shifted by one; target_mask [B, T] marks the tokens to learn.
    """
    logp = token_logprobs(logits[:, :-1], input_ids[:, 1:])
    mask = target_mask[:, 1:]
    loss = -masked_mean(logp, mask)
    return loss, {"sft_loss": loss.detach(), "tokens": mask.sum()}


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
    ratio = torch.exp(_kept(logprobs - old_logprobs, mask))
    advantages = _kept(advantages, mask)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    loss = -masked_mean(torch.minimum(unclipped, clipped), mask)
    with torch.no_grad():
        clip_fraction = masked_mean(((ratio - 1.0).abs() > clip_eps).float(), mask)
        approx_kl = masked_mean(old_logprobs - logprobs, mask)
    stats = {
        "pg_loss": loss.detach(),
        "clip_fraction": clip_fraction,
        "approx_kl": approx_kl,
        "ratio_mean": masked_mean(ratio.detach(), mask),
    }
    return loss, stats


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor, coefs=1.0):
    """The penalty sum over tokens of coef * KL(pi_theta || pi_ref) / tokens, with the k3 estimator per token
    (Schulman, "Approximating KL divergence", 2020), and the plain KL's mean as ``kl_ref``.

    k3 = exp(ref - logp) - (ref - logp) - 1 is unbiased for samples from pi_theta and never negative.
    Keeping a self-play policy near its reference keeps its play diverse. ``coefs``: one coefficient, or one per
    row ([rows, 1]: a role's own).
    """
    delta = _kept(ref_logprobs - logprobs, mask)
    k3 = torch.exp(delta) - delta - 1.0
    return masked_mean(coefs * k3, mask), {"kl_ref": masked_mean(k3, mask).detach()}


def kl_cost_to_go(proximal_logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor):
    """Each action token's KL cost to go, for the KL as a cost in the advantage (``kl_estimator: reward``).

    c_t = sum over the row's action tokens s >= t of (log pi_prox(a_s) - log pi_ref(a_s)). Subtracting
    coef * c_t from a token's advantage makes the policy gradient that of E[R] - coef * KL(pi || pi_ref) over the
    row's action (the reverse KL; its score-function estimate). The k3 penalty in the loss (``kl_penalty``)
    differentiates to the forward KL(pi_ref || pi) instead (Tang and Munos, 2025), which holds on to every
    move the reference plays. With the reverse KL the update is magnetic mirror descent's (Sokota et al.
    2023: the reference is the magnet), whose last iterate converges in two-player zero-sum games.
    """
    per_token = _kept((proximal_logprobs - ref_logprobs) * mask, mask)
    to_go = _kept(per_token.flip(-1).cumsum(-1).flip(-1) * mask, mask)
    return to_go, {"kl_ref": (per_token.sum() / mask.sum().clamp(min=1)).detach()}


def reinforce_loss(logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor):
    """REINFORCE (Williams 1992): L = -E_t[A_t log pi_theta(a_t)]; on-policy, no correction."""
    loss = -masked_mean(_kept(advantages, mask) * _kept(logprobs, mask), mask)
    return loss, {"pg_loss": loss.detach()}


def decoupled_ppo_loss(
    logprobs: torch.Tensor,
    proximal_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float = 0.2,
    weight_range: tuple[float, float] = (0.0, 5.0),
    out_of_range: str = "mask",
):
    """Decoupled PPO (Hilton et al. 2022; AReaL, Fu et al. 2025, eq. 5), for data from stale policies.

    L = -E_t[w_t min(r_t A_t, clip(r_t, 1-eps, 1+eps) A_t)],  r_t = pi_theta / pi_prox,  w_t = pi_prox / mu.
    The trust region is centred on the proximal policy (the learner's weights before this update), not on
    the behaviour policy that sampled the tokens, which may be several versions old; w_t corrects for that
    gap. Weights outside ``weight_range`` are either dropped from the loss (``"mask"``, as AReaL does with
    its cap) or clamped into it (``"clamp"``). With mu = pi_prox, w = 1 and this is ``ppo_clip_loss``.
    """
    if out_of_range not in ("mask", "clamp"):
        raise ValueError(f"out_of_range must be 'mask' or 'clamp', not {out_of_range!r}")
    low, high = weight_range
    if not 0.0 <= low < high:
        raise ValueError(f"weight_range must satisfy 0 <= low < high, not {weight_range}")
    with torch.no_grad():
        weights = torch.exp(_kept(proximal_logprobs - behaviour_logprobs, mask))
        outside = ((weights < low) | (weights > high)) & mask.bool()
        if out_of_range == "mask":
            kept = mask.bool() & ~outside
            weights = torch.where(kept, weights, torch.zeros_like(weights))
        else:
            kept = mask.bool()
            weights = weights.clamp(low, high)
    ratio = torch.exp(_kept(logprobs - proximal_logprobs, mask))
    advantages = _kept(advantages, mask)
    surrogate = torch.minimum(ratio * advantages, torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages)
    # Averaged over every action token of the batch, kept or not: a masked token weighs zero, as in AReaL.
    loss = -masked_mean(weights * surrogate, mask)
    with torch.no_grad():
        clip_fraction = masked_mean(((ratio - 1.0).abs() > clip_eps).float(), kept)
        tokens = mask.sum().clamp(min=1)
        stats = {
            "pg_loss": loss.detach(),
            "clip_fraction": clip_fraction,
            "approx_kl": masked_mean(proximal_logprobs - logprobs, kept),
            "is_weight_mean": masked_mean(weights, kept),
            "is_weight_max": torch.where(kept, weights, 0.0).max(),  # weights >= 0: 0 with no token kept
            "is_outside_share": outside.sum() / tokens,  # masked or clamped
        }
    return loss, stats


def truncated_is_loss(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cap: float = 2.0,
):
    """Policy gradient with truncated importance sampling (IMPALA's rho-bar, Espeholt et al. 2018).

    L = -E_t[min(rho_t, cap) A_t log pi_theta(a_t)],  rho_t = pi_theta / mu (no gradient through rho).
    Truncation bounds the variance that a few very unlikely behaviour tokens would otherwise bring.
    """
    if cap <= 0:
        raise ValueError(f"cap must be positive, not {cap}")
    with torch.no_grad():
        rho = torch.exp(_kept(logprobs - behaviour_logprobs, mask))
        weights = rho.clamp(max=cap)
    loss = -masked_mean(weights * _kept(advantages, mask) * _kept(logprobs, mask), mask)
    with torch.no_grad():
        stats = {
            "pg_loss": loss.detach(),
            "is_weight_mean": masked_mean(weights, mask),
            "is_outside_share": masked_mean((rho > cap).float(), mask),  # truncated
            "approx_kl": masked_mean(behaviour_logprobs - logprobs, mask),
        }
    return loss, stats


def entropy_bonus(logits: torch.Tensor, mask: torch.Tensor, temperature: float = 1.0):
    """Mean entropy of the sampling distribution at the masked positions; subtract coef * it from the loss.

    logits [B, T, V], mask [B, T]. Computed block by block, as the log-probs are (``per_token``).
    """
    entropy = per_token(functools.partial(_entropy, temperature=temperature), logits)
    value = masked_mean(entropy, mask)
    return value, {"entropy": value.detach()}
