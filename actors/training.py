"""From a training batch (an Arrow table of agent-turns) to one policy-gradient update."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch

from algos.advantages import seat_baseline_advantages
from algos.losses import kl_penalty, ppo_clip_loss, token_logprobs
from streams.schema import Columns


@dataclass
class TokenBatch:
    """Right-padded prompt+action tokens; the action positions carry the recorded behaviour."""

    input_ids: torch.Tensor  # [N, T]
    attention_mask: torch.Tensor  # [N, T]
    action_mask: torch.Tensor  # [N, T], True where the token is an action token (predicted at t-1)
    behaviour_logprobs: torch.Tensor  # [N, T], zero outside action tokens
    versions: torch.Tensor  # [N, T], -1 outside action tokens
    returns: torch.Tensor  # [N]
    seats: torch.Tensor  # [N]
    groups: torch.Tensor  # [N], one id per (matchup, seat): the baseline groups


def collate(table: pa.Table, pad_id: int) -> TokenBatch:
    prompts = table.column(Columns.PROMPT_IDS).to_pylist()
    actions = table.column(Columns.ACTION_IDS).to_pylist()
    logprobs = table.column(Columns.BEHAVIOUR_LOGPROBS).to_pylist()
    versions = table.column(Columns.POLICY_VERSIONS).to_pylist()
    n, width = len(prompts), max(len(p) + len(a) for p, a in zip(prompts, actions))
    ids = np.full((n, width), pad_id, dtype=np.int64)
    action_mask = np.zeros((n, width), dtype=bool)
    behaviour = np.zeros((n, width), dtype=np.float32)
    token_versions = np.full((n, width), -1, dtype=np.int64)
    for i, (p, a) in enumerate(zip(prompts, actions)):
        end = len(p) + len(a)
        ids[i, : len(p)], ids[i, len(p) : end] = p, a
        action_mask[i, len(p) : end] = True
        behaviour[i, len(p) : end] = logprobs[i]
        token_versions[i, len(p) : end] = versions[i]
    lengths = np.array([len(p) + len(a) for p, a in zip(prompts, actions)])
    return TokenBatch(
        input_ids=torch.from_numpy(ids),
        attention_mask=torch.from_numpy((np.arange(width)[None, :] < lengths[:, None]).astype(np.int64)),
        action_mask=torch.from_numpy(action_mask),
        behaviour_logprobs=torch.from_numpy(behaviour),
        versions=torch.from_numpy(token_versions),
        returns=torch.tensor(table.column(Columns.EPISODE_RETURN).to_numpy(), dtype=torch.float32),
        seats=torch.tensor(table.column(Columns.AGENT).to_numpy(), dtype=torch.int64),
        groups=_baseline_groups(table),
    )


def _baseline_groups(table: pa.Table) -> torch.Tensor:
    keys = list(zip(table.column(Columns.MATCHUP).to_pylist(), table.column(Columns.AGENT).to_pylist()))
    ids = {key: i for i, key in enumerate(sorted(set(keys)))}
    return torch.tensor([ids[key] for key in keys], dtype=torch.int64)


def action_logprobs(model, batch: TokenBatch, temperature: float) -> torch.Tensor:
    """[N, T-1] log-probs of every next token; position t predicts token t+1."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    return token_logprobs(logits[:, :-1], batch.input_ids[:, 1:], temperature)


def policy_gradient_step(model, optimizer, batch: TokenBatch, *, temperature: float, clip_eps: float,
                         max_grad_norm: float, reference=None, kl_coef: float = 0.0) -> dict:
    """One PPO-clip update with a per-seat baseline; the behaviour log-probs are the old policy.

    With a ``reference`` model and ``kl_coef`` > 0, a KL penalty towards the reference is added.
    """
    advantages, _ = seat_baseline_advantages(batch.returns, batch.groups)
    seats = batch.seats.unique().tolist()
    adv_stats = {f"return_seat{s}": batch.returns[batch.seats == s].mean().item() for s in seats}
    model.train()
    logprobs = action_logprobs(model, batch, temperature)
    mask = batch.action_mask[:, 1:]  # everything that describes targets shifts by one, too
    loss, stats = ppo_clip_loss(logprobs, batch.behaviour_logprobs[:, 1:],
                                advantages[:, None].expand_as(logprobs), mask, clip_eps)
    if reference is not None and kl_coef > 0:
        with torch.no_grad():
            ref_logprobs = action_logprobs(reference, batch, temperature)
        kl, kl_stats = kl_penalty(logprobs, ref_logprobs, mask)
        loss = loss + kl_coef * kl
        stats.update(kl_stats)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    model.eval()
    with torch.no_grad():
        gap = ((logprobs - batch.behaviour_logprobs[:, 1:]).abs() * mask).sum() / mask.sum().clamp(min=1)
    return {**stats, **adv_stats, "grad_norm": float(grad_norm), "logprob_gap": float(gap),
            "tokens": int(mask.sum()), "rows": int(batch.input_ids.shape[0])}
