"""A training batch as the learner's model reads it: replay's agent-turns as padded token tensors.

Replay sends the learner an Arrow table, one row per agent-turn (``streams.schema``). ``collate`` lays each row's
prompt and action tokens out right-padded, puts on the action positions what generation recorded for each token
(its behaviour log-prob and the policy version that sampled it), and numbers the rows by what the advantage
estimators group them by: the turns that share a return, the role whose baseline a row shares, a role's attempts
at one task, and the state the agent stood in. The update maths is ``actors/learner/update.py``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch

from streams.schema import Columns, trajectory_table


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
    role_keys: list[tuple]  # [N], (env, matchup, role or seat): whose baseline a row shares
    groups: torch.Tensor  # [N], one id per (episode, role or seat): a role's attempts at one task
    state_keys: list[int]  # [N], a digest of the prompt: where the agent stood (rae_state's key)
    truncated: torch.Tensor  # [N], the completion was cut at its token budget (``action_truncated``)

    def rows(self, index: torch.Tensor) -> TokenBatch:
        """The rows ``index`` of this batch (for minibatches)."""
        picked = {name: value[index] if isinstance(value, torch.Tensor) else [value[i] for i in index.tolist()]
                  for name, value in vars(self).items()}
        return TokenBatch(**picked)

    def trimmed(self) -> TokenBatch:
        """Without the padding columns that every row has (right padding: the rows' longest decides)."""
        width = max(int(self.attention_mask.sum(1).max()), 1) if len(self.role_keys) else 1
        cut = {name: value[:, :width] if isinstance(value, torch.Tensor) and value.dim() == 2 else value
               for name, value in vars(self).items()}
        return TokenBatch(**cut)

    def to(self, device: torch.device) -> TokenBatch:
        """This batch's tensors on ``device`` (copied without blocking; on the CPU, the batch itself)."""
        if device.type == "cpu":
            return self
        return TokenBatch(**{name: value.to(device, non_blocking=True) if isinstance(value, torch.Tensor) else value
                             for name, value in vars(self).items()})


def collate(table: pa.Table, pad_id: int) -> TokenBatch:
    """The rows of ``table`` (agent-turns, ``streams.schema.TRAJECTORY_SCHEMA``) as one ``TokenBatch``, padded with
    ``pad_id`` to the longest row. Ids are numbered in the order rows first appear: a segment per (episode, seat),
    a group per (episode, role), and a role is the game's named role where it has one, else the seat."""
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
    roles = [role or seat for role, seat in zip(table.column(Columns.ROLE).to_pylist(), seats)]
    group_ids: dict[tuple, int] = {}
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
                           roles)),
        groups=torch.tensor([group_ids.setdefault(k, len(group_ids)) for k in zip(episodes, roles)], dtype=torch.int64),
        state_keys=[prompt_digest(p) for p in prompts],
        truncated=torch.tensor(table.column(Columns.ACTION_TRUNCATED).to_numpy(zero_copy_only=False), dtype=torch.bool),
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
