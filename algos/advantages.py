"""Advantage estimators and returns: pure functions over tensors that return ``(advantages, stats)``.

Each estimator takes one return per row (an agent-turn) and whatever grouping it needs as arguments.
A "group" or "role" key is an integer id per row; the trainer decides what it means (for games, one id
per (environment, matchup, seat), so that seats of different strength, and games against different
opponents, never share a baseline).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch

# A running baseline is not moved by a batch whose mean return lies beyond this either way: no honest run returns
# that much (the reward actor refuses a reward or return beyond ``reward.args.max_abs``, 1000 by default), and one
# forged row of 3e38 once made a role's baseline 3.75e37, so that every step of the next ~200 updates was skipped.
# Wider than the reward's bound on purpose: the objective does not see that setting, and a run that raises it
# must not find its baselines frozen.
BASELINE_RANGE = 1e6


def discounted_returns(rewards: torch.Tensor, segments: torch.Tensor, turns: torch.Tensor,
                       gamma: float = 1.0) -> torch.Tensor:
    """Per-turn returns G_t = r_t + gamma * G_{t+1}, within each segment (an agent's turns in one episode).

    rewards, segments, turns: [N]; rows may come in any order, ``turns`` orders them inside a segment.
    With gamma = 1 and the outcome credited to an agent's last turn, every turn gets the episode return.
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must lie in [0, 1], not {gamma}")
    order = np.lexsort((turns.numpy(), segments.numpy()))  # by segment, then turn
    r, seg = rewards.double().numpy()[order], segments.numpy()[order]
    out = np.zeros_like(r)
    running = 0.0
    for i in range(len(order) - 1, -1, -1):
        if i == len(order) - 1 or seg[i + 1] != seg[i]:
            running = 0.0
        running = r[i] + gamma * running
        out[i] = running
    returns = torch.empty(len(order), dtype=torch.float32)
    returns[torch.from_numpy(order)] = torch.from_numpy(out).float()
    return returns


def grpo_advantages(returns: torch.Tensor, groups: torch.Tensor, scale_by_std: bool = True,
                    eps: float = 1e-6):
    """Group-normalised advantages (GRPO, Shao et al. 2024, eq. 3 for outcome rewards).

    A_i = (R_i - mean_g R) / (std_g R + eps) over the rows of the same group g. ``scale_by_std=False``
    keeps only the mean subtraction (Dr. GRPO, Liu et al. 2025: the std division over-weights groups whose
    returns barely differ). A group of one row gets advantage 0.
    """
    advantages = torch.zeros_like(returns, dtype=torch.float32)
    stats = {}
    for group in groups.unique().tolist():
        sel = groups == group
        r = returns[sel].float()
        adv = r - r.mean()
        if scale_by_std and r.numel() > 1:
            adv = adv / (r.std() + eps)
        advantages[sel] = adv
        stats[f"return_group{group}"] = r.mean().item()
    return advantages, stats


def role_group_advantages(returns: torch.Tensor, groups: torch.Tensor, segments: torch.Tensor, roles: torch.Tensor,
                          baselines: dict[int, float], decay: float = 0.95, scale_by_std: bool = False,
                          max_abs: float = BASELINE_RANGE):
    """Advantages for role self-play (Absolute Zero's per-role baselines): a role that makes several attempts at
    one task in an episode (``groups``: one id per (episode, role); k solvers of one proposal) gets GRPO within
    that group; a role that acts once an episode (the proposer) gets RAE's running baseline of its role. A group
    counts its attempts as distinct ``segments`` (an agent's turns in one episode), so one agent's several turns
    are not attempts of their own."""
    attempts: dict[int, set] = {}
    for g, seg in zip(groups.tolist(), segments.tolist()):
        attempts.setdefault(g, set()).add(seg)
    several = torch.tensor([len(attempts[g]) > 1 for g in groups.tolist()], dtype=torch.bool)
    advantages = torch.zeros_like(returns, dtype=torch.float32)
    stats: dict = {"baselines": dict(baselines)}
    if (~several).any():
        once, stats = rae_advantages(returns[~several], roles[~several], baselines, decay, segments[~several],
                                     max_abs)
        advantages[~several] = once
    if several.any():
        grouped, _ = grpo_advantages(returns[several], groups[several], scale_by_std)
        advantages[several] = grouped
        stats["attempt_groups"] = len({g for g, s in zip(groups.tolist(), several.tolist()) if s})
    return advantages, stats


def rebn_advantages(returns: torch.Tensor, eps: float = 1e-6):
    """Return batch normalisation (ReBN; GEM, Liu et al. 2025): A_i = (R_i - mean R) / (std R + eps).

    One baseline for the whole batch; with per-turn discounted returns this is GEM's multi-turn estimator.
    """
    r = returns.float()
    std = r.std() if r.numel() > 1 else torch.tensor(0.0)
    advantages = (r - r.mean()) / (std + eps)
    return advantages, {"return_mean": r.mean().item(), "return_std": float(std)}


def rae_advantages(returns: torch.Tensor, roles: torch.Tensor, baselines: dict[int, float], decay: float = 0.95,
                   segments: torch.Tensor | None = None, max_abs: float = BASELINE_RANGE):
    """Role-conditioned advantage estimation (RAE; SPIRAL, Liu et al. 2025, sec. 3.3).

    Each role (for self-play: one (game, seat) pair) keeps an exponential moving average of its returns,
    updated once per trajectory, b <- decay * b + (1 - decay) * R, and A_i = R_i - b_role(i), with the
    baseline updated first. A batch holding n trajectories of a role moves its baseline as n such updates
    would, the batch mean standing in for each: b <- decay^n * b + (1 - decay^n) * mean(R). (A per-batch
    decay of 0.95 would lag tens of updates behind a policy that is changing; the advantages would then
    share one sign, and a policy pushed away from everything it sampled collapses.) A role seen for the
    first time starts at its batch mean. In a zero-sum game seen from both seats, this removes each seat's
    own expected outcome (the first mover's edge in TicTacToe), which one shared baseline would turn into a
    push on one seat and a pull on the other.

    ``segments`` (one id per trajectory, e.g. per (episode, seat)) counts the trajectories; without it each
    row counts as one. ``baselines`` maps role id -> baseline and is not modified; the updated map is
    returned in the stats under ``"baselines"``, for the caller to keep.

    A role whose batch mean lies beyond ``max_abs`` either way (or is not a number) keeps its baseline (a role
    seen for the first time gets none: 0 stands in), its rows' advantages are taken against it, and the stats
    count it in ``"baselines_skipped"``: one batch of poison costs that batch, not the hundreds after it.
    """
    if not 0.0 <= decay < 1.0:
        raise ValueError(f"decay must lie in [0, 1), not {decay}")
    advantages = torch.zeros_like(returns, dtype=torch.float32)
    updated = dict(baselines)
    stats = {}
    skipped = 0
    for role in roles.unique().tolist():
        sel = roles == role
        batch_mean = returns[sel].float().mean().item()
        if not abs(batch_mean) <= max_abs:
            skipped += 1
            advantages[sel] = returns[sel].float() - updated.get(role, 0.0)
            stats[f"baseline_role{role}"] = updated.get(role, 0.0)
            continue
        n = int(segments[sel].unique().numel()) if segments is not None else int(sel.sum())
        previous = updated.get(role, batch_mean)
        updated[role] = decay**n * previous + (1.0 - decay**n) * batch_mean
        advantages[sel] = returns[sel].float() - updated[role]
        stats[f"baseline_role{role}"] = updated[role]
    stats["baselines"] = updated
    if skipped:
        stats["baselines_skipped"] = skipped
    return advantages, stats


class StateValues:
    """Running mean returns per (role, observed state), for a baseline that knows where an agent stood.

    A multi-turn generalisation of GRPO's per-prompt group: an observation that recurs (a board position, a
    question asked again) keeps the mean return of the turns taken from it. Each entry averages about the
    last ``window`` visits, so it follows a changing policy; at most ``capacity`` entries are kept, the least
    recently seen going first (prompts that never recur cost a bounded table, not a leak).
    """

    def __init__(self, window: int = 64, capacity: int = 100_000):
        if window < 1 or capacity < 1:
            raise ValueError(f"window and capacity must be >= 1, not {window} and {capacity}")
        self.window, self.capacity = window, capacity
        self.table: OrderedDict[tuple, tuple[int, float]] = OrderedDict()  # key -> (visits, capped at window; mean)

    def get(self, key: tuple) -> tuple[int, float]:
        return self.table.get(key, (0, 0.0))

    def update(self, key: tuple, count: int, mean: float) -> None:
        visits, value = self.table.pop(key, (0, 0.0))
        visits += count
        value += min(1.0, count / min(visits, self.window)) * (mean - value)  # the exact mean until the window fills
        self.table[key] = (min(visits, self.window), value)
        while len(self.table) > self.capacity:
            self.table.popitem(last=False)

    def __len__(self) -> int:
        return len(self.table)


def state_advantages(returns: torch.Tensor, roles: torch.Tensor, states: list, baselines: dict[int, float],
                     values: StateValues, prior: float = 4.0, decay: float = 0.95,
                     segments: torch.Tensor | None = None, max_abs: float = BASELINE_RANGE):
    """RAE with its role baseline refined per observed state: A_i = R_i - b(role_i, s_i).

    b(role, s) = (n * V + prior * b_role) / (n + prior), where V is the mean return of the n earlier visits to
    state s in that role (``values``, from earlier batches only, so a row's own return never enters its
    baseline) and b_role is the role's RAE baseline. An unvisited state gets the RAE baseline; a state seen
    often gets its own mean. Credit then goes to the move that changed the outcome from where the agent
    stood (the block, the winning move) rather than to every move of a won game. ``values`` is updated with
    this batch's returns, in place; the updated role baselines come back in the stats under ``"baselines"``. As
    with the role baselines (`rae_advantages`), a state whose batch mean lies beyond ``max_abs`` is not updated.
    """
    if prior <= 0:
        raise ValueError(f"prior must be > 0, not {prior}")
    _, stats = rae_advantages(returns, roles, baselines, decay, segments, max_abs)
    role_baselines = stats["baselines"]
    keys = [(role, state) for role, state in zip(roles.tolist(), states)]
    baseline = torch.empty(len(keys), dtype=torch.float32)
    known = 0
    for i, key in enumerate(keys):
        visits, value = values.get(key)
        known += visits > 0
        baseline[i] = (visits * value + prior * role_baselines.get(key[0], 0.0)) / (visits + prior)
    sums: dict[tuple, list] = {}
    for key, ret in zip(keys, returns.float().tolist()):
        entry = sums.setdefault(key, [0, 0.0])
        entry[0] += 1
        entry[1] += ret
    for key, (count, total) in sums.items():
        if abs(total / count) <= max_abs:
            values.update(key, count, total / count)
    stats["states_known"] = known / max(len(keys), 1)
    stats["states_tracked"] = len(values)
    return returns.float() - baseline, stats
