"""The length cut: rows of very different lengths are not padded to each other.

Rows (longest first) are cut into groups of at most a token budget (rows x the longest of them) and a new group
starts wherever a row is at most ``1 / MAX_SPREAD`` of its group's longest, so padding never more than doubles a
group's tokens. The learner cuts its micro-batches with it (``actors/learner/microbatches.py``) and the rollout
its sampling passes (``passes`` in ``actors/rollout/hf_engine.py``).
"""

from __future__ import annotations

MAX_SPREAD = 2.0  # a group's longest row over its shortest stays under this


def cut(rows: list[int], lengths: list[int], budget: int | None) -> list[list[int]]:
    """``rows`` (positions into ``lengths``, longest first) cut into micro-batches of at most ``budget`` padded
    tokens (rows x the longest of them; None: no bound), a new one wherever a row is at most ``1 / MAX_SPREAD``
    of its micro-batch's longest."""
    batches, current, longest = [], [], 0
    for row in rows:
        width = max(longest, lengths[row])
        over_budget = budget is not None and width * (len(current) + 1) > budget
        if current and (over_budget or lengths[row] * MAX_SPREAD <= longest):
            batches.append(current)
            current, width = [], lengths[row]
        current.append(row)
        longest = width
    if current:
        batches.append(current)
    return batches
