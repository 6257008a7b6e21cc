"""The importance-weight statistics of an update (actors/learner/update.py), on log-probs written by hand."""

import math
from dataclasses import dataclass

import pytest
import torch

from actors.learner.group import Shard
from actors.learner.update import ImportanceStats

LN2 = math.log(2.0)


def micro_batch(log2_w: list[list[float]], versions: list[list[int]], mask: list[list[bool]]):
    """Proximal and behaviour log-probs whose difference is ``log2_w`` in log base 2 (w = pi_prox / mu)."""
    behaviour = torch.full((len(log2_w), len(log2_w[0])), -2.0)
    return behaviour + torch.tensor(log2_w) * LN2, behaviour, torch.tensor(mask), torch.tensor(versions)


# three action tokens, log2 w = 0.25 and 1.75 (sampled by version 3) and -0.75 (by version 2), in two micro-batches;
# the masked-out position (a prompt's) holds a weight far out of range that must not count
FIRST = micro_batch([[0.25, 1.75]], [[3, 3]], [[True, True]])
SECOND = micro_batch([[-0.75, 100.0]], [[2, 3]], [[True, False]])


def test_the_statistics_of_the_importance_weights_are_those_computed_by_hand():
    stats = ImportanceStats(version=3)
    stats.add(*FIRST)
    stats.add(*SECOND)
    got = stats.statistics()
    w = [2 ** 0.25, 2 ** 1.75, 2 ** -0.75]
    assert got["logprob_gap"] == pytest.approx((0.25 + 1.75 + 0.75) * LN2 / 3)
    assert got["logprob_gap_same_version"] == pytest.approx((0.25 + 1.75) * LN2 / 2)  # version 3's two tokens
    assert got["is_ess"] == pytest.approx(sum(w) ** 2 / (3 * sum(x * x for x in w)))  # 0.675
    # 16 bins of half a unit of log2 w over [-4, 4], keyed by 2 ** (each bin's upper edge)
    assert got["is_weight_hist"] == {"0.7071": 1, "1.414": 1, "4": 1}


def test_without_the_learners_version_there_is_no_same_version_gap():
    stats = ImportanceStats()
    stats.add(*FIRST)
    assert "logprob_gap_same_version" not in stats.statistics()
    assert ImportanceStats().statistics() == {"is_weight_hist": {}, "logprob_gap": 0.0}  # no tokens: no ESS


@dataclass(frozen=True)
class TwinRanks(Shard):
    """Rank 0 of 2 whose peer saw the same tokens: the group's sums are twice this rank's."""

    def sum(self, values):
        return [2 * v for v in values]


def test_in_a_group_the_statistics_are_over_every_ranks_tokens():
    stats = ImportanceStats(version=3)
    stats.add(*FIRST)
    stats.add(*SECOND)
    alone, group = stats.statistics(), stats.statistics(TwinRanks(0, 2))
    assert group["is_weight_hist"] == {"0.7071": 2, "1.414": 2, "4": 2}  # the counts add up
    assert group["logprob_gap"] == pytest.approx(alone["logprob_gap"])  # means over twice the tokens
    assert group["is_ess"] == pytest.approx(alone["is_ess"])
