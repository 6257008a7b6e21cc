"""The autoscaling decision, as a pure function of the queue's history."""

import pytest

from actors.runs.config import AutoscaleConfig
from actors.runs.autoscale import autoscale_target

CFG = AutoscaleConfig(enabled=True, min_actors=1, max_actors=3, queue_high=10, idle_above=0.5, patience=3)


def test_a_queue_that_stays_deep_adds_one_actor_and_a_passing_spike_does_not():
    assert autoscale_target(CFG, 1, [(11, 0.0)] * 3) == 2
    assert autoscale_target(CFG, 2, [(25, 0.0)] * 3) == 3  # the threshold is per actor: 25 > 20
    assert autoscale_target(CFG, 2, [(19, 0.0)] * 3) == 2
    assert autoscale_target(CFG, 1, [(50, 0.0), (5, 0.0), (50, 0.0)]) == 1
    assert autoscale_target(CFG, 1, [(50, 0.0)] * 2) == 1  # not yet patient enough
    assert autoscale_target(CFG, 3, [(99, 0.0)] * 3) == 3  # at the maximum


def test_idle_actors_are_removed_down_to_the_minimum():
    assert autoscale_target(CFG, 3, [(0, 0.9)] * 3) == 2
    assert autoscale_target(CFG, 1, [(0, 0.9)] * 3) == 1
    assert autoscale_target(CFG, 3, [(0, 0.9), (0, 0.2), (0, 0.9)]) == 3
    assert autoscale_target(CFG, 5, []) == 3  # outside the range: back into it


def test_a_bad_range_is_refused():
    with pytest.raises(ValueError, match="min_actors <= max_actors"):
        AutoscaleConfig(min_actors=3, max_actors=2)
