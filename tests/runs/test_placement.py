"""Where the launcher asks Ray to put actors (``ray.resources``): checked before any actor starts."""

import pytest

from actors.cli import load_config
from actors.runs.ray_cluster import actor_kind, check_resources


def test_resources_are_read_per_actor_kind_from_the_config():
    cfg = load_config(["+ray.resources.rollout={GPU: 1}", "+ray.resources.learner={trainer: 0.5}"])
    assert check_resources(cfg.ray.resources) == {"rollout": {"GPU": 1}, "learner": {"trainer": 0.5}}
    assert [actor_kind(n) for n in ("rollout-3", "learner-m", "env-0", "replay")] == [
        "rollout", "learner", "env", "replay"]


@pytest.mark.parametrize("resources, problem", [
    ({"rollouts": {"GPU": 1}}, "unknown actor kind 'rollouts'"),
    ({"rollout": 1}, r"ray.resources.rollout must map resource names to amounts >= 0, not 1"),
    ({"env": {"head": -1}}, "amounts >= 0"),
])
def test_a_bad_placement_is_refused_with_the_reason(resources, problem):
    with pytest.raises(ValueError, match=problem):
        check_resources(resources)
