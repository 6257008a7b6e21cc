"""From a training batch (an Arrow table of agent-turns) to one policy-gradient update.

``Objective`` names the advantage estimator and the loss (pure functions in ``algos/``) and their
settings; ``policy_gradient_step`` computes returns, advantages and the loss, and steps the optimizer.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import torch

from algos.advantages import (StateValues, discounted_returns, grpo_advantages, rae_advantages, rebn_advantages,
                              state_advantages)
from algos.losses import (decoupled_ppo_loss, entropy_bonus, kl_cost_to_go, kl_penalty, ppo_clip_loss,
                          reinforce_loss, token_logprobs, truncated_is_loss)
from streams.schema import Columns, trajectory_table

LOSSES = ("decoupled_ppo", "ppo", "truncated_is", "reinforce")
ADVANTAGES = ("rae", "rae_state", "grpo", "grpo_mean", "rebn")
KL_ESTIMATORS = ("loss", "reward")


@dataclass
class Objective:
    """What the learner optimises. Defaults: RAE advantages with the decoupled PPO loss (self-play)."""

    loss: str = "decoupled_ppo"  # decoupled_ppo | ppo (clip on pi/mu: "naive" off-policy PPO) | truncated_is |
    # reinforce
    advantage: str = "rae"  # rae | rae_state (refined per observed state) | grpo (mean and std per role) |
    # grpo_mean (mean only) | rebn (whole batch)
    gamma: float = 1.0  # per-turn discount of returns within an agent's turns
    clip_eps: float = 0.2
    weight_range: tuple[float, float] = (0.0, 5.0)  # decoupled PPO: allowed pi_prox / mu
    out_of_range: str = "mask"  # decoupled PPO: mask or clamp weights outside weight_range
    tis_cap: float = 2.0  # truncated IS: cap on pi / mu
    rae_decay: float = 0.95  # RAE: EMA decay of each role's baseline, per trajectory
    state_prior: float = 4.0  # rae_state: visits a state needs before its own mean outweighs the role baseline
    state_window: int = 64  # rae_state: a state's mean follows about its last this many visits
    state_capacity: int = 100_000  # rae_state: states kept (least recently seen dropped first)
    kl_coef: float = 0.0  # > 0: KL penalty towards a reference policy (the starting one)
    kl_estimator: str = "loss"  # loss: k3 in the loss (forward KL's gradient) | reward: a cost in the advantage
    # (reverse KL; magnetic mirror descent)
    entropy_coef: float = 0.0  # > 0: entropy bonus
    max_grad_norm: float = 1.0
    minibatches: int = 4  # optimizer steps per batch; > 1 recomputes pi_prox before the first

    def __post_init__(self):
        if self.loss not in LOSSES:
            raise ValueError(f"unknown loss {self.loss!r}; choose one of {', '.join(LOSSES)}")
        if self.advantage not in ADVANTAGES:
            raise ValueError(f"unknown advantage estimator {self.advantage!r}; choose one of {', '.join(ADVANTAGES)}")
        if self.minibatches < 1:
            raise ValueError(f"minibatches must be >= 1, not {self.minibatches}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"unknown KL estimator {self.kl_estimator!r}; choose one of {', '.join(KL_ESTIMATORS)}")
        self.weight_range = tuple(self.weight_range)


@dataclass
class TrainerState:
    """What the objective carries from batch to batch: stable role ids, their RAE baselines and, for
    ``rae_state``, the mean returns per observed state."""

    role_ids: dict[tuple, int] = field(default_factory=dict)
    baselines: dict[int, float] = field(default_factory=dict)
    state_values: StateValues | None = None

    def roles(self, keys: list[tuple]) -> torch.Tensor:
        return torch.tensor([self.role_ids.setdefault(key, len(self.role_ids)) for key in keys], dtype=torch.int64)


@dataclass
class TokenBatch:
    """Right-padded prompt+action tokens; the action positions carry the recorded behaviour."""

    input_ids: torch.Tensor  # [N, T]
    attention_mask: torch.Tensor  # [N, T]
    action_mask: torch.Tensor  # [N, T], True where the token is an action token (predicted at t-1)
    behaviour_logprobs: torch.Tensor  # [N, T], zero outside action tokens
    versions: torch.Tensor  # [N, T], -1 outside action tokens
    rewards: torch.Tensor  # [N], this turn's reward
    returns: torch.Tensor  # [N], the agent's episode return
    seats: torch.Tensor  # [N]
    turns: torch.Tensor  # [N]
    segments: torch.Tensor  # [N], one id per (episode, seat): the turns that share a return
    role_keys: list[tuple]  # [N], (env, matchup, seat): whose baseline a row shares
    state_keys: list[int]  # [N], a digest of the prompt: where the agent stood (rae_state's key)

    def rows(self, index: torch.Tensor) -> TokenBatch:
        """The rows ``index`` of this batch (for minibatches)."""
        picked = {name: value[index] if isinstance(value, torch.Tensor) else [value[i] for i in index.tolist()]
                  for name, value in vars(self).items()}
        return TokenBatch(**picked)


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
    seats = table.column(Columns.AGENT).to_pylist()
    episodes = table.column(Columns.EPISODE_ID).to_pylist()
    segment_ids: dict[tuple, int] = {}
    return TokenBatch(
        input_ids=torch.from_numpy(ids),
        attention_mask=torch.from_numpy((np.arange(width)[None, :] < lengths[:, None]).astype(np.int64)),
        action_mask=torch.from_numpy(action_mask),
        behaviour_logprobs=torch.from_numpy(behaviour),
        versions=torch.from_numpy(token_versions),
        rewards=torch.tensor(table.column(Columns.REWARD).to_numpy(), dtype=torch.float32),
        returns=torch.tensor(table.column(Columns.EPISODE_RETURN).to_numpy(), dtype=torch.float32),
        seats=torch.tensor(seats, dtype=torch.int64),
        turns=torch.tensor(table.column(Columns.TURN).to_numpy(), dtype=torch.int64),
        segments=torch.tensor([segment_ids.setdefault(k, len(segment_ids)) for k in zip(episodes, seats)]),
        role_keys=list(zip(table.column(Columns.ENV_NAME).to_pylist(), table.column(Columns.MATCHUP).to_pylist(),
                           seats)),
        state_keys=[prompt_digest(p) for p in prompts],
    )


def prompt_digest(prompt: list[int]) -> int:
    """A stable 64-bit digest of prompt tokens (the same across processes and resumes, unlike ``hash``)."""
    digest = hashlib.blake2b(np.asarray(prompt, dtype=np.int64).tobytes(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def single_turn_batch(prompts: list[list[int]], completions: list, returns: list[float] | None = None,
                      pad_id: int = 0) -> TokenBatch:
    """One-turn episodes, one per ``(prompt, completion)`` (a ``Completion``: tokens, log-probs, versions), as
    the learner collates them: for measuring a generation engine against the learner, and for tests."""
    returns = returns or [0.0] * len(prompts)
    rows = [{Columns.EPISODE_ID: f"e{i}", Columns.ENV_NAME: "single_turn", Columns.SEED: 0, Columns.TURN: 0,
             Columns.AGENT: 0, Columns.MATCHUP: "main", Columns.POLICY_ID: "main", Columns.PROMPT_IDS: prompt,
             Columns.ACTION_IDS: c.token_ids, Columns.ACTION_TEXT: "", Columns.BEHAVIOUR_LOGPROBS: c.logprobs,
             Columns.POLICY_VERSIONS: c.versions, Columns.REWARD: ret, Columns.TERMINATED: True,
             Columns.TRUNCATED: False, Columns.EPISODE_RETURN: ret, Columns.INVALID_ACTION: False,
             Columns.CREATED_AT: 0.0, Columns.GENERATED_AT: 0.0, Columns.SCORED_AT: 0.0}
            for i, (prompt, c, ret) in enumerate(zip(prompts, completions, returns))]
    return collate(trajectory_table(rows), pad_id)


def behaviour_gap(model, batch: TokenBatch, temperature: float) -> float:
    """Mean |log pi - log mu| over the action tokens: the model's log-probs against the behaviour ones."""
    with torch.no_grad():
        logprobs = action_logprobs(model, batch, temperature)
    mask = batch.action_mask[:, 1:]
    return float((logprobs - batch.behaviour_logprobs[:, 1:]).abs()[mask].mean())


def action_logits(model, batch: TokenBatch) -> torch.Tensor:
    """[N, T-1, V]: position t predicts token t+1."""
    return model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]


def action_logprobs(model, batch: TokenBatch, temperature: float) -> torch.Tensor:
    """[N, T-1] log-probs of every next token."""
    return token_logprobs(action_logits(model, batch), batch.input_ids[:, 1:], temperature)


def advantages_of(objective: Objective, state: TrainerState, batch: TokenBatch) -> tuple[torch.Tensor, dict]:
    """One advantage per row, from per-turn discounted returns and the objective's estimator."""
    returns = discounted_returns(batch.rewards, batch.segments, batch.turns, objective.gamma)
    roles = state.roles(batch.role_keys)
    if objective.advantage == "rae":
        advantages, stats = rae_advantages(returns, roles, state.baselines, objective.rae_decay, batch.segments)
        state.baselines = stats.pop("baselines")
    elif objective.advantage == "rae_state":
        if state.state_values is None:
            state.state_values = StateValues(objective.state_window, objective.state_capacity)
        advantages, stats = state_advantages(returns, roles, batch.state_keys, state.baselines, state.state_values,
                                             objective.state_prior, objective.rae_decay, batch.segments)
        state.baselines = stats.pop("baselines")
    elif objective.advantage == "rebn":
        advantages, stats = rebn_advantages(returns)
    else:
        advantages, stats = grpo_advantages(returns, roles, scale_by_std=objective.advantage == "grpo")
    return advantages, stats


def _loss(objective: Objective, logprobs, proximal, behaviour, advantages, mask):
    if objective.loss == "decoupled_ppo":
        return decoupled_ppo_loss(logprobs, proximal, behaviour, advantages, mask, objective.clip_eps,
                                  objective.weight_range, objective.out_of_range)
    if objective.loss == "ppo":
        return ppo_clip_loss(logprobs, behaviour, advantages, mask, objective.clip_eps)
    if objective.loss == "truncated_is":
        return truncated_is_loss(logprobs, behaviour, advantages, mask, objective.tis_cap)
    return reinforce_loss(logprobs, advantages, mask)


def policy_gradient_step(model, optimizer, batch: TokenBatch, objective: Objective, state: TrainerState, *,
                         temperature: float, reference=None, generator: torch.Generator | None = None,
                         version: int | None = None) -> dict:
    """One update of ``model`` on ``batch``: ``objective.minibatches`` optimizer steps over shuffled rows.

    The proximal policy pi_prox is the model as it is before the first step. With one minibatch its
    log-probs are the current ones, detached (the same numbers a second forward pass would give); with
    more, they are computed once, up front, for every row.

    ``logprob_gap`` is the mean |log pi_prox - log mu| of the action tokens: staleness and the generation
    engine's numerics together. Given the model's ``version``, ``logprob_gap_same_version`` is the same over
    the tokens that version sampled: what is left is the engine's mismatch with the learner alone.
    """
    advantages, stats = advantages_of(objective, state, batch)
    seat_returns = {f"return_seat{s}": batch.returns[batch.seats == s].mean().item() for s in batch.seats.unique().tolist()}
    proximal_all = None
    if objective.minibatches > 1:
        with torch.no_grad():
            proximal_all = action_logprobs(model, batch, temperature)
    order = torch.randperm(batch.input_ids.shape[0], generator=generator)
    model.train()
    step_stats: list[dict] = []
    gaps, tokens, same_gaps, same_tokens = [], 0, [], 0
    for index in torch.chunk(order, objective.minibatches):
        mb = batch.rows(index)
        logits = action_logits(model, mb)
        logprobs = token_logprobs(logits, mb.input_ids[:, 1:], temperature)
        proximal = proximal_all[index] if proximal_all is not None else logprobs.detach()
        mask = mb.action_mask[:, 1:]  # everything that describes targets shifts by one, too
        behaviour = mb.behaviour_logprobs[:, 1:]
        token_advantages, kl_stats = advantages[index][:, None].expand_as(logprobs), {}
        ref_logprobs = None
        if reference is not None and objective.kl_coef > 0:
            with torch.no_grad():
                ref_logprobs = action_logprobs(reference, mb, temperature)
            if objective.kl_estimator == "reward":
                cost, kl_stats = kl_cost_to_go(proximal, ref_logprobs, mask)
                token_advantages = token_advantages - objective.kl_coef * cost
        loss, s = _loss(objective, logprobs, proximal, behaviour, token_advantages, mask)
        s.update(kl_stats)
        if objective.entropy_coef > 0:
            entropy, e = entropy_bonus(logits, mask, temperature)
            loss = loss - objective.entropy_coef * entropy
            s.update(e)
        if ref_logprobs is not None and objective.kl_estimator == "loss":
            kl, k = kl_penalty(logprobs, ref_logprobs, mask)
            loss = loss + objective.kl_coef * kl
            s.update(k)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        s["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(model.parameters(), objective.max_grad_norm))
        optimizer.step()
        step_stats.append(s)
        gap = (proximal - behaviour).abs() * mask
        gaps.append(gap.sum())
        tokens += int(mask.sum())
        if version is not None:
            same = mb.versions[:, 1:] == version
            same_gaps.append((gap * same).sum())
            same_tokens += int((mask & same).sum())
    model.eval()
    merged = {key: sum(s[key] for s in step_stats) / len(step_stats) for key in step_stats[0]}
    if same_tokens:
        merged["logprob_gap_same_version"] = float(sum(same_gaps) / same_tokens)
    return {**stats, **merged, **seat_returns, "logprob_gap": float(sum(gaps) / max(tokens, 1)),
            "tokens": tokens, "rows": int(batch.input_ids.shape[0])}
