"""Which rows a minibatch computes, cut into micro-batches by a token budget and shared among a learner group's ranks.

``trained_rows`` leaves out the rows with no gradient (advantage 0, no KL term, no entropy bonus: a GRPO group
that all scored alike) and, with ``row_share_by_role``, a seeded draw of a role's rows: in role self-play a
proposer's row is about four times a solver's tokens and is most of what the learner computes
(``docs/learner.md``).

A micro-batch is padded to its own longest row only, so its memory is about ``rows x longest`` tokens:
``max_tokens_per_microbatch`` bounds that product. Rows are sorted by length before they are cut (rows of
similar length share a micro-batch: little padding). A row longer than the budget is a micro-batch of its own.
With a budget or without, a row at most ``1 / MAX_SPREAD`` (``actors/models/padding.py``) as long as its
micro-batch's longest starts the next one, so padding never more than doubles a pass's tokens: a minibatch of
proposer rows (about 230 tokens) and solver rows (about 60) padded all to the longest cost the learner three
times its tokens (``research/padding.py``).

With a group of ``world`` ranks, the length-sorted rows are dealt round-robin to the ranks (each gets about the
same tokens), and every rank runs the same number of micro-batches: a sharded model gathers its parameters in
every forward pass, so the ranks' passes must pair up. A rank with fewer rows than micro-batches runs empty
ones (a row whose action mask is empty: it adds nothing to the loss or the gradient). The group itself, its
ranks and their sums: ``actors/learner/group.py``.
"""

from __future__ import annotations

import torch

from actors.models.padding import cut

NEGLIGIBLE_ADVANTAGE = 1e-6  # a row's |advantage| at most this has no gradient (``trained_rows``)


def plan(lengths: list[int], budget: int | None, world: int = 1) -> list[list[list[int]]]:
    """For each rank, its micro-batches of a minibatch whose rows have ``lengths``: lists of positions into
    ``lengths``, the same number of micro-batches for every rank (some perhaps empty)."""
    if budget is not None and budget < 1:
        raise ValueError(f"max_tokens_per_microbatch must be >= 1 (or null), not {budget}")
    longest_first = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    shares = [cut(longest_first[r::world], lengths, budget) for r in range(world)]
    count = max(1, max(len(share) for share in shares))
    for share in shares:
        while len(share) < count:
            splittable = [b for b in share if len(b) > 1]
            if not splittable:
                share.append([])
                continue
            largest = max(splittable, key=len)
            share.remove(largest)
            half = len(largest) // 2
            share += [largest[:half], largest[half:]]
    return shares


def trained_rows(objective, advantages: torch.Tensor, batch, reference, generator: torch.Generator | None = None):
    """Which rows of ``batch`` (a ``TokenBatch``) the update computes, for ``objective`` (an ``Objective``).

    Not one with no KL term, no entropy bonus and |advantage| at most ``NEGLIGIBLE_ADVANTAGE`` (a GRPO group's that
    all scored alike; a running baseline decaying towards a constant return, -2e-10): each loss is the advantage
    times something, so leaving it out moves the update no more. And of a role with a row share below 1, only the
    rows that a draw from ``generator`` keeps at that rate: the role learns from a sample of its rows, as with a
    smaller batch (its gradient is not scaled up)."""
    if objective.entropy_coef > 0:
        trained = torch.ones_like(advantages, dtype=torch.bool)
    else:
        idle = advantages.abs() <= NEGLIGIBLE_ADVANTAGE
        if reference is not None and objective.anchored:
            idle &= objective.kl_coefs(batch.role_keys) == 0
        trained = ~idle
    if objective.truncated_actions == "mask":  # completions cut at their budget: context, never trained
        trained &= ~batch.truncated
    shares = objective.row_shares(batch.role_keys)
    if bool((shares < 1).any()):  # no draw otherwise: the generator's stream stays as it was
        trained &= torch.rand(len(shares), generator=generator) < shares
    return trained
