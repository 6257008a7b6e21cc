"""The update maths: from a ``TokenBatch`` (``actors/learner/batch.py``) to one policy-gradient update.

``Objective`` names the advantage estimator and the loss (pure functions in ``algos/``) and their settings;
``ObjectiveState`` is what the objective carries from one batch to the next (the baselines).
``policy_gradient_step`` computes returns, advantages and the loss, and steps the optimizer: its minibatches,
their micro-batches (``actors/learner/microbatches.py``) and, in a learner group, each rank's share of them
(``actors/learner/group.py``). ``ImportanceStats`` measures how far the behaviour policy that sampled the tokens
lies from the proximal one that the update corrects towards.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from algos.advantages import (StateValues, discounted_returns, grpo_advantages, rae_advantages, rebn_advantages,
                              role_group_advantages, state_advantages)
from algos.losses import (decoupled_ppo_loss, entropy_bonus, kl_cost_to_go, kl_penalty, ppo_clip_loss,
                          reinforce_loss, token_logprobs, truncated_is_loss)
from actors.learner import microbatches
from actors.learner.batch import TokenBatch
from actors.learner.group import Shard

LOSSES = ("decoupled_ppo", "ppo", "truncated_is", "reinforce")
LOSS_ALIASES = {"naive_ppo": "ppo"}  # PPO's clip on pi/mu is the "naive" off-policy PPO of the literature
ADVANTAGES = ("rae", "rae_state", "grpo", "grpo_mean", "rebn", "role_grpo")
KL_ESTIMATORS = ("loss", "reward")
TRUNCATED_ACTIONS = ("train", "mask")  # what the update does with a completion cut at its token budget
IS_LOG2_BINS = (-4.0, 4.0, 16)  # is_weight_hist: log2 of w in 16 bins over [1/16, 16] (beyond: the outer bins)
NONFINITE_LOSS = "nonfinite_loss_max"  # while a minibatch runs: 1 if a micro-batch's loss was not finite


@dataclass
class Objective:
    """What the learner optimises. Defaults: RAE advantages with the decoupled PPO loss (self-play)."""

    loss: str = "decoupled_ppo"  # decoupled_ppo | ppo (clip on pi/mu: "naive" off-policy PPO) | truncated_is |
    # reinforce
    advantage: str = "rae"  # rae | rae_state (refined per observed state) | grpo (mean and std per role) |
    # grpo_mean (mean only) | rebn (whole batch) | role_grpo (GRPO over a role's attempts at one task, RAE for a
    # role that acts once an episode: role self-play)
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
    kl_coef_by_role: dict[str, float] = field(default_factory=dict)  # a named role's own coefficient (others:
    # kl_coef), e.g. {solver: 0.1, proposer: 0.0}: anchor one role of a role game and leave another free
    row_share_by_role: dict[str, float] = field(default_factory=dict)  # a named role's share of its rows trained
    # (others: all), a seeded draw per batch: for a role whose rows cost far more compute (docs/learner.md)
    entropy_coef: float = 0.0  # > 0: entropy bonus
    max_grad_norm: float = 1.0
    minibatches: int = 4  # optimizer steps per batch; > 1 recomputes pi_prox before the first
    truncated_actions: str = "train"  # a completion cut at max_new_tokens: train it as any | mask: leave its tokens
    # out of the update (env.args.truncation_penalty penalises it instead, or as well)

    def __post_init__(self):
        self.loss = LOSS_ALIASES.get(self.loss, self.loss)
        for what, value, known in (("loss", self.loss, LOSSES), ("advantage estimator", self.advantage, ADVANTAGES),
                                    ("KL estimator", self.kl_estimator, KL_ESTIMATORS)):
            if value not in known:
                raise ValueError(f"unknown {what} {value!r}; choose one of {', '.join(known)}")
        if self.truncated_actions not in TRUNCATED_ACTIONS:
            raise ValueError(f"truncated_actions must be one of {', '.join(TRUNCATED_ACTIONS)}, not "
                             f"{self.truncated_actions!r}")
        if self.minibatches < 1:
            raise ValueError(f"minibatches must be >= 1, not {self.minibatches}")
        self.kl_coef_by_role = dict(self.kl_coef_by_role or {})
        for role, coef in [("kl_coef", self.kl_coef), *self.kl_coef_by_role.items()]:
            if isinstance(coef, bool) or not isinstance(coef, (int, float)) or not coef >= 0:
                raise ValueError(f"a KL coefficient must be a number >= 0, not {coef!r} (for {role})")
        self.row_share_by_role = dict(self.row_share_by_role or {})
        for role, share in self.row_share_by_role.items():
            if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
                raise ValueError(f"a row share must be a number in (0, 1], not {share!r} (for {role})")
        self.weight_range = tuple(self.weight_range)

    @property
    def anchored(self) -> bool:
        """Does any row pay a KL penalty towards the reference policy (which must then be loaded)?"""
        return self.kl_coef > 0 or any(coef > 0 for coef in self.kl_coef_by_role.values())

    def kl_coefs(self, role_keys: list[tuple]) -> torch.Tensor:
        """Each row's KL coefficient: its role's (``kl_coef_by_role``) or ``kl_coef``."""
        return torch.tensor([float(self.kl_coef_by_role.get(key[2], self.kl_coef)) for key in role_keys])

    def row_shares(self, role_keys: list[tuple]) -> torch.Tensor:
        """Each row's chance of being trained: its role's ``row_share_by_role``, else 1."""
        return torch.tensor([float(self.row_share_by_role.get(key[2], 1.0)) for key in role_keys])


@dataclass
class ObjectiveState:
    """What the objective carries from batch to batch: stable role ids, their RAE baselines and, for
    ``rae_state``, the mean returns per observed state. Every rank of a learner group computes the same advantages
    from the same batch, so each holds the same state; a checkpoint keeps it (``role_ids``, ``baselines``,
    ``state_values`` in ``trainer_state.pt``)."""

    role_ids: dict[tuple, int] = field(default_factory=dict)
    baselines: dict[int, float] = field(default_factory=dict)
    state_values: StateValues | None = None

    def roles(self, keys: list[tuple]) -> torch.Tensor:
        """Each row's role id, from its role key (a role seen for the first time gets the next id)."""
        return torch.tensor([self.role_ids.setdefault(key, len(self.role_ids)) for key in keys], dtype=torch.int64)


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


def advantages_of(objective: Objective, state: ObjectiveState, batch: TokenBatch) -> tuple[torch.Tensor, dict]:
    """One advantage per row, from per-turn discounted returns and the objective's estimator."""
    returns = discounted_returns(batch.rewards, batch.segments, batch.turns, objective.gamma)
    roles = state.roles(batch.role_keys)
    if objective.advantage == "rae":
        advantages, stats = rae_advantages(returns, roles, state.baselines, objective.rae_decay, batch.segments)
    elif objective.advantage == "rae_state":
        if state.state_values is None:
            state.state_values = StateValues(objective.state_window, objective.state_capacity)
        advantages, stats = state_advantages(returns, roles, batch.state_keys, state.baselines, state.state_values,
                                             objective.state_prior, objective.rae_decay, batch.segments)
    elif objective.advantage == "role_grpo":
        advantages, stats = role_group_advantages(returns, batch.groups, batch.segments, roles, state.baselines,
                                                  objective.rae_decay)
    elif objective.advantage == "rebn":
        advantages, stats = rebn_advantages(returns)
    else:
        advantages, stats = grpo_advantages(returns, roles, scale_by_std=objective.advantage == "grpo")
    state.baselines = stats.pop("baselines", state.baselines)  # RAE's running baselines, for the next batch
    return advantages, stats


def _loss(objective: Objective, logprobs, proximal, behaviour, advantages, mask):
    """The objective's loss function (``algos/losses.py``) on per-token log-probs: ``(loss, statistics)``, the
    loss a mean over the ``mask``ed tokens."""
    if objective.loss == "decoupled_ppo":
        return decoupled_ppo_loss(logprobs, proximal, behaviour, advantages, mask, objective.clip_eps,
                                  objective.weight_range, objective.out_of_range)
    if objective.loss == "ppo":
        return ppo_clip_loss(logprobs, behaviour, advantages, mask, objective.clip_eps)
    if objective.loss == "truncated_is":
        return truncated_is_loss(logprobs, behaviour, advantages, mask, objective.tis_cap)
    return reinforce_loss(logprobs, advantages, mask)


class ImportanceStats:
    """How far the behaviour policy mu lies from the proximal one pi_prox over an update's action tokens, summed
    micro-batch by micro-batch (``add``) and over a learner group's ranks at the end (``statistics``):

    - ``logprob_gap``: the mean |log pi_prox - log mu|, staleness and the generation engine's numerics together;
    - ``logprob_gap_same_version``: the same over the tokens that ``version`` (the learner's) sampled, if any: what
      is left is the engine's mismatch with the learner alone;
    - ``is_ess``: the normalised effective sample size of the importance weights w = pi_prox / mu,
      (sum w)^2 / (n sum w^2), 1 when every token's behaviour policy is the proximal one (what
      ``max_staleness=auto`` and the collapse guard read);
    - ``is_weight_hist``: the tokens counted by log2 w in ``IS_LOG2_BINS``, keyed by each bin's upper edge.
    """

    def __init__(self, version: int | None = None):
        self.version = version
        # summed on the device, read once by ``statistics``: |gap|, tokens, the same version's |gap| and tokens,
        # sum w, sum w^2, then the histogram's bins (float64: the sums a float would have added up on the host)
        self.totals: torch.Tensor | None = None

    def add(self, proximal: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor, versions: torch.Tensor) -> None:
        """One micro-batch: the log-probs of pi_prox and mu, its action tokens' ``mask`` and each token's policy
        ``versions``, all [rows, T-1] (the positions that predict a token). Nothing is read back to the host."""
        gap = torch.where(mask, (proximal - behaviour).abs(), 0.0).detach()
        # w at most e^30, so that w^2 stays finite
        w = torch.exp(torch.where(mask, (proximal - behaviour).clamp(max=30.0), 0.0)).detach()
        low, high, bins = IS_LOG2_BINS
        # a position outside the mask goes below the histogram's range, which histc leaves out
        log_w = torch.where(mask, torch.log2(w).float().clamp(low, high - 1e-6), low - 1.0)
        if self.version is not None:
            same = versions == self.version
            same_gap, same_tokens = (gap * same).sum(), (mask & same).sum()
        else:
            same_gap = same_tokens = gap.new_zeros(())
        sums = [gap.sum(), mask.sum(), same_gap, same_tokens, torch.where(mask, w, 0.0).sum(),
                torch.where(mask, w * w, 0.0).sum()]
        added = torch.cat([torch.stack([x.double() for x in sums]),
                           torch.histc(log_w, bins=bins, min=low, max=high).double()])
        self.totals = added if self.totals is None else self.totals + added

    def statistics(self, shard: Shard = Shard()) -> dict:
        """The statistics over every rank's tokens. In a group it is a collective: every rank calls it once."""
        totals = self.totals.tolist() if self.totals is not None else [0.0] * (6 + IS_LOG2_BINS[2])
        gap, tokens, same_gap, same_tokens, w_sum, w2_sum, *w_bins = shard.sum(totals)
        stats = {}
        if same_tokens:
            stats["logprob_gap_same_version"] = same_gap / same_tokens
        if tokens and w2_sum > 0 and math.isfinite(w2_sum):
            stats["is_ess"] = min(w_sum * w_sum / (tokens * w2_sum), 1.0)  # capped against rounding
        low, high, bins = IS_LOG2_BINS
        stats["is_weight_hist"] = {f"{2 ** (low + (k + 1) * (high - low) / bins):.4g}": int(n) for k, n in
                                   enumerate(w_bins) if n}
        stats["logprob_gap"] = gap / max(tokens, 1)
        return stats


def policy_gradient_step(model, optimizer, batch: TokenBatch, objective: Objective, state: ObjectiveState, *,
                         temperature: float, reference=None, generator: torch.Generator | None = None,
                         version: int | None = None, max_tokens_per_microbatch: int | None = None,
                         shard: Shard = Shard(), compute_dtype: torch.dtype | None = None) -> dict:
    """One update of ``model`` on ``batch``: ``objective.minibatches`` optimizer steps over shuffled rows.

    Each minibatch is cut into micro-batches of at most ``max_tokens_per_microbatch`` padded tokens
    (``actors/learner/microbatches.py``) whose gradients add up to the minibatch's before the step: each
    micro-batch's loss (a mean over its action tokens) is weighted by its share of the minibatch's action tokens,
    so the update is the same however the minibatch was cut. Rows with no gradient, and those a role's row share
    leaves out (``microbatches.trained_rows``), are not computed; the statistics are means over the others
    (``rows_trained`` of ``rows``). In a learner group (``shard``) every rank holds the whole batch (the same
    advantages, minibatches and row draw everywhere) and trains its share of each minibatch's rows; the sharded
    model sums the ranks' gradients.

    The proximal policy pi_prox is the model as it is before the first step. With one minibatch its log-probs are
    the current ones, detached (the same numbers a second forward pass would give); with more, they are computed
    once, up front, for every row. ``ImportanceStats`` reports how far the behaviour policy lies from it
    (``logprob_gap``, ``logprob_gap_same_version`` for the tokens ``version`` sampled, ``is_ess``,
    ``is_weight_hist``). ``compute_dtype`` (bf16 on a GPU): the forward passes run under autocast; log-probs are
    fp32.

    A minibatch whose loss or gradient norm is not finite takes no optimizer step (``skipped_steps``; its
    statistics are left out of the means): one NaN would otherwise reach every parameter. In a group every rank
    decides on the same numbers (the group's maximum of that flag, and its gradient norm): all skip it or none.

    On a GPU every number read back to the host waits for the kernels queued before it: the statistics of a
    minibatch's micro-batches add up on the device and are read once, with its gradient norm, before the step is
    decided (``read_floats``); a micro-batch's logits are freed before the next one's forward pass. The function
    returns once the device has finished the update (a CUDA sync), so that a caller's clock (the learner's
    ``train_s``) times the update rather than its launch.
    """
    advantages, stats = advantages_of(objective, state, batch)
    seat_returns = {f"return_seat{s}": batch.returns[batch.seats == s].mean().item()
                    for s in batch.seats.unique().tolist()}
    for role in sorted({key[2] for key in batch.role_keys if isinstance(key[2], str)}):  # a game's named roles
        rows = torch.tensor([key[2] == role for key in batch.role_keys])
        seat_returns[f"return_role_{role}"] = batch.returns[rows].mean().item()
    device = next(model.parameters()).device
    autocast = torch.autocast(device.type, dtype=compute_dtype,
                              enabled=compute_dtype is not None and compute_dtype != torch.float32)
    order = torch.randperm(batch.input_ids.shape[0], generator=generator)
    lengths = batch.attention_mask.sum(1).tolist()
    loss_mask = batch.action_mask[:, 1:]
    row_tokens = loss_mask.sum(1).tolist()  # each row's action tokens, read on the host once
    trained = microbatches.trained_rows(objective, advantages, batch, reference, generator)
    steps = []  # per minibatch: its action tokens, those trained, and this rank's micro-batches (rows, action tokens)
    for index in torch.chunk(order, objective.minibatches):
        kept = index[trained[index]].tolist()  # the loss stays a mean over every row's tokens: the same update
        micro = microbatches.plan([lengths[i] for i in kept], max_tokens_per_microbatch, shard.world)[shard.rank]
        steps.append((sum(row_tokens[i] for i in index.tolist()), sum(row_tokens[i] for i in kept),
                      [(torch.tensor([kept[p] for p in r]) if r else None, sum(row_tokens[kept[p]] for p in r))
                       for r in micro]))

    def micro_batch(rows):
        if rows is None:  # an empty micro-batch (a rank with fewer rows than the group's micro-batches)
            empty = batch.rows(order[:1])
            empty.action_mask = torch.zeros_like(empty.action_mask)
            return empty.trimmed().to(device)
        return batch.rows(rows).trimmed().to(device)

    proximal = {}
    if objective.minibatches > 1:
        with torch.no_grad(), autocast:
            for i, (_, _, micro) in enumerate(steps):
                for j, (rows, _) in enumerate(micro):
                    proximal[i, j] = action_logprobs(model, micro_batch(rows), temperature)
    model.train()
    sync = getattr(model, "set_requires_gradient_sync", None)  # a sharded model: sum gradients once a step
    importance = ImportanceStats(version)
    step_stats, skipped = [], []  # the statistics of the minibatches that took a step, and of those that did not
    for i, (tokens, tokens_trained, micro) in enumerate(steps):
        optimizer.zero_grad(set_to_none=True)
        weighted: dict[str, torch.Tensor] = {}  # on the device, read once the minibatch's passes are done
        for j, (rows, mb_tokens) in enumerate(micro):
            if sync is not None:
                sync(j == len(micro) - 1)
            mb = micro_batch(rows)
            with autocast:
                logits = action_logits(model, mb)
            logprobs = token_logprobs(logits, mb.input_ids[:, 1:], temperature)
            prox = proximal[i, j] if proximal else logprobs.detach()
            row_advantages = advantages[rows] if rows is not None else torch.zeros(1)
            loss, s = _micro_loss(objective, mb, logits, logprobs, prox, row_advantages.to(device), reference,
                                  temperature, autocast)
            s[NONFINITE_LOSS] = (~torch.isfinite(loss.detach())).double()
            (loss * (mb_tokens / max(tokens, 1)) * shard.world).backward()  # the group averages over its ranks
            del logits, logprobs, loss  # before the next micro-batch's forward pass, not after it
            for key, value in s.items():  # statistics: means over the trained rows
                value = value.double()
                weighted[key] = torch.maximum(weighted.get(key, value), value) if key.endswith("_max") else \
                    weighted.get(key, 0.0) + mb_tokens / max(tokens_trained, 1) * value
            importance.add(prox, mb.behaviour_logprobs[:, 1:], mb.action_mask[:, 1:], mb.versions[:, 1:])
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), objective.max_grad_norm)
        weighted["grad_norm"] = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        weighted = read_floats(weighted)  # the minibatch's one wait for the device
        norm = weighted.pop("grad_norm")
        weighted = shard.merge(weighted)  # the group's: every rank reads the same numbers below
        weighted["grad_norm"] = norm  # the group's already
        if weighted.pop(NONFINITE_LOSS) or not math.isfinite(weighted["grad_norm"]):
            optimizer.zero_grad(set_to_none=True)  # no step: the optimizer's moments and count stay as they were
            skipped.append(weighted)
            continue
        optimizer.step()
        step_stats.append(weighted)
    model.eval()
    if device.type == "cuda":  # the caller's clock (the learner's train_s) then times the work, not its launch
        torch.cuda.synchronize(device)
    kept = step_stats or skipped
    merged = {key: sum(s[key] for s in kept) / len(kept) for key in kept[0]}
    merged["skipped_steps"] = len(skipped)
    return {**stats, **merged, **importance.statistics(shard), **seat_returns, "tokens": int(loss_mask.sum()),
            "rows": int(batch.input_ids.shape[0]), "rows_trained": int(trained.sum()),
            "microbatches": sum(len(m) for _, _, m in steps)}


def read_floats(values: dict[str, torch.Tensor]) -> dict[str, float]:
    """0-dim tensors as Python floats, copied to the host together: one wait for a GPU instead of one each."""
    read = torch.stack([value.double() for value in values.values()]).tolist()
    return dict(zip(values, read))


def _micro_loss(objective: Objective, mb: TokenBatch, logits, logprobs, proximal, advantages, reference,
                temperature: float, autocast) -> tuple[torch.Tensor, dict]:
    """The objective's loss on one micro-batch: a mean over its action tokens, and its statistics."""
    mask = mb.action_mask[:, 1:]
    behaviour = mb.behaviour_logprobs[:, 1:]
    token_advantages, kl_stats = advantages[:, None].expand_as(logprobs), {}
    ref_logprobs = None
    if reference is not None and objective.anchored:
        coefs = objective.kl_coefs(mb.role_keys).to(logprobs.device)[:, None]  # [rows, 1]
        with torch.no_grad(), autocast:
            ref_logprobs = action_logprobs(reference, mb, temperature)
        if objective.kl_estimator == "reward":
            cost, kl_stats = kl_cost_to_go(proximal, ref_logprobs, mask)
            token_advantages = token_advantages - coefs * cost
    loss, s = _loss(objective, logprobs, proximal, behaviour, token_advantages, mask)
    s.update(kl_stats)
    if objective.entropy_coef > 0:
        entropy, e = entropy_bonus(logits, mask, temperature)
        loss = loss - objective.entropy_coef * entropy
        s.update(e)
    if ref_logprobs is not None and objective.kl_estimator == "loss":
        penalty, k = kl_penalty(logprobs, ref_logprobs, mask, coefs)
        loss = loss + penalty
        s.update(k)
    return loss, s
