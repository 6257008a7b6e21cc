"""Advantage estimators: pure functions over tensors."""

from __future__ import annotations

import torch


def seat_baseline_advantages(returns: torch.Tensor, seats: torch.Tensor, normalize: bool = True, eps: float = 1e-6):
    """Advantage = return minus the mean return of the same seat in the batch.

    A per-seat baseline matters in games where seats differ in strength (in TicTacToe the first mover
    wins far more often): one shared baseline would push the first seat up and the second down whatever
    they played. A "seat" here is any integer group: the trainer uses one per (matchup, seat), so games
    against different opponents do not share a baseline either. With ``normalize`` each group's
    advantages are also divided by that group's std.
    returns, seats: [N] (one entry per agent-turn or per episode-seat).
    """
    advantages = torch.zeros_like(returns, dtype=torch.float32)
    stats = {}
    for seat in seats.unique().tolist():
        sel = seats == seat
        r = returns[sel].float()
        adv = r - r.mean()
        if normalize and r.numel() > 1:
            adv = adv / (r.std() + eps)
        advantages[sel] = adv
        stats[f"return_seat{seat}"] = r.mean().item()
    return advantages, stats
