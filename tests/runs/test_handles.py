"""The driver's handles on actors: each face is what its actor class really offers (same methods, same
signatures), a handle refuses what its face does not declare, and each actor's statistics hold exactly the keys
its kind's TypedDict declares."""

import inspect
import re

import pytest
import trio

from actors.env.actor import EnvActor, EnvConfig
from actors.env.evaluation import EvaluationTally
from actors.env.face import EnvFace, EnvStatistics, EvaluationShare
from actors.league.actor import LeagueActor, LeagueConfig
from actors.league.face import LeagueFace, LeagueStatistics
from actors.learner.actor import LearnerActor, LearnerConfig
from actors.learner.face import LearnerFace, LearnerStatistics
from actors.replay.actor import ReplayActor, ReplayConfig
from actors.replay.face import ReplayFace, ReplayStatistics
from actors.reward.actor import RewardActor, RewardConfig
from actors.reward.face import RewardFace, RewardStatistics
from actors.rollout.actor import RolloutActor, RolloutConfig
from actors.rollout.face import RolloutFace, RolloutStatistics
from actors.runs.handles import call_unless_dead, declared, handle
from streams.channels import MemoryTransport

FACES = [(EnvFace, EnvActor), (LeagueFace, LeagueActor), (LearnerFace, LearnerActor), (ReplayFace, ReplayActor),
         (RewardFace, RewardActor), (RolloutFace, RolloutActor)]


class Died(Exception):
    """What the fake cluster raises for an actor it was told is dead."""


class Cluster:
    """Records what reaches it; ``dead`` actors raise ``Died``, which it recognizes as death."""

    def __init__(self, dead=()):
        self.calls, self.dead = [], set(dead)

    def call(self, name, method, *args):
        self.calls.append((name, method, *args))
        if name in self.dead:
            raise Died(name)
        return len(self.calls)

    def statistics(self, name):
        self.calls.append((name, "statistics (its own road)"))
        return {"name": name}

    def is_dead(self, error):
        return isinstance(error, Died)


def parameters(function) -> list[tuple]:
    signature = inspect.signature(function)
    return [(p.name, p.kind, p.default, p.annotation) for p in signature.parameters.values()] + \
        [signature.return_annotation]


@pytest.mark.parametrize("face, actor", FACES, ids=[face.__name__ for face, _ in FACES])
def test_each_actor_class_has_every_method_of_its_face_with_the_same_signature(face, actor):
    methods = declared(face)
    assert "statistics" in methods
    for method in methods:
        assert callable(getattr(actor, method, None)), f"{actor.__name__} has no {method}"
        assert parameters(getattr(actor, method)) == parameters(getattr(face, method)), f"{actor.__name__}.{method}"


def test_a_handle_forwards_a_declared_method_checked_against_its_face():
    cluster = Cluster()
    env = handle(cluster, "env-0", EnvFace)
    env.evaluate("start", 4)  # the face's defaults go too: they are the actor's
    env.set_rollouts(addresses=["a"], member="m")  # keywords go as positions: the cluster passes no keywords
    assert handle(cluster, "replay", ReplayFace).statistics() == {"name": "replay"}
    assert cluster.calls == [("env-0", "evaluate", "start", 4, "random", "policy"),
                             ("env-0", "set_rollouts", ["a"], "m"), ("replay", "statistics (its own road)")]
    with pytest.raises(TypeError):
        env.rebalance((0, 1))  # its delta missing: refused here, not by the actor
    assert len(cluster.calls) == 3


def test_a_method_the_face_does_not_declare_is_refused_before_the_cluster():
    cluster = Cluster()
    env, league = handle(cluster, "env-0", EnvFace), handle(cluster, "league", LeagueFace)
    with pytest.raises(AttributeError, match=r"env-0: EnvFace declares no 'evalute'; the driver may call .*evaluate"):
        env.evalute("start", 4)
    with pytest.raises(AttributeError, match="declares no 'run'"):
        env.run  # the actor's own, not the driver's
    with pytest.raises(AttributeError, match="LeagueFace declares no 'rewind'"):
        league.rewind(3)  # another kind's
    with pytest.raises(AttributeError):
        env._admission  # nothing private
    assert cluster.calls == []


def test_a_call_to_a_dead_actor_is_skipped_and_any_other_error_raised():
    cluster = Cluster(dead=["env-1"])
    assert call_unless_dead(handle(cluster, "env-0", EnvFace).reissue) == 1
    assert call_unless_dead(handle(cluster, "env-1", EnvFace).reissue) is None
    assert call_unless_dead(handle(cluster, "replay", ReplayFace).rewind, 5) == 3
    assert cluster.calls == [("env-0", "reissue"), ("env-1", "reissue"), ("replay", "rewind", 5)]
    with pytest.raises(Died):
        handle(cluster, "env-1", EnvFace).reissue()  # without call_unless_dead a death is the caller's
    cluster.is_dead = lambda error: False
    with pytest.raises(Died):
        call_unless_dead(handle(cluster, "env-1", EnvFace).reissue)


def keys(statistics: dict, shape) -> None:
    """``statistics`` hold every required key of the TypedDict ``shape``, and nothing it does not declare."""
    assert shape.__required_keys__ <= statistics.keys(), shape.__required_keys__ - statistics.keys()
    assert statistics.keys() <= shape.__required_keys__ | shape.__optional_keys__, \
        statistics.keys() - shape.__required_keys__ - shape.__optional_keys__


def test_the_statistics_of_each_actor_hold_the_keys_its_kind_declares(tmp_path):
    env = EnvActor(EnvConfig(tokenizer_path="unused"), name="env-0").statistics()
    seats = {k for k in env if re.fullmatch(r"mean_return_seat\d+", k)}
    assert seats == {"mean_return_seat0", "mean_return_seat1"}  # one per seat: named by the game, not the shape
    keys({k: v for k, v in env.items() if k not in seats}, EnvStatistics)
    keys(EvaluationTally("start", "random", 2).summary(), EvaluationShare)
    members = [{"id": "main", "role": "main"}]
    keys(LeagueActor(LeagueConfig(members=members, state_dir=str(tmp_path))).statistics(), LeagueStatistics)
    keys(LearnerActor(LearnerConfig(model_path="unused")).statistics(), LearnerStatistics)
    keys(RewardActor(RewardConfig()).statistics(), RewardStatistics)
    keys(RolloutActor(RolloutConfig(model_path="unused")).statistics(), RolloutStatistics)
    keys(replay_statistics(), ReplayStatistics)


def replay_statistics() -> dict:
    """A replay actor's statistics once it runs (it keeps its batch count from its start)."""
    async def main():
        transport = MemoryTransport()
        replay = ReplayActor(ReplayConfig(batch_episodes=2, capacity_episodes=2))
        async with transport.open_receiver(capacity=1) as learner, trio.open_nursery() as nursery:
            await nursery.start(replay.run, transport, {"learner": [learner.address]})
            stats = replay.statistics()
            nursery.cancel_scope.cancel()
        return stats

    return trio.run(main)
