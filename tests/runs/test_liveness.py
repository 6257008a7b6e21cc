"""The health check's deadline (``run.ping_timeout_s``, ``run.ping_misses``): an actor that stops answering makes
the driver wait no longer than the deadline; its last statistics stand in while it is silent; silent
``ping_misses`` checks in a row it is hung: its stacks are asked for and it is restarted as a dead one is. The
real path (Ray, a stopped process) is ``tests/system/test_liveness.py``."""

import pytest

from actors.cli import load_config
from actors.runs.recovery import NO_ANSWER, HungActor, Liveness, statistics_or_recover


class Silent:
    """A cluster whose ``quiet`` actors answer no health check."""

    def __init__(self, misses: int):
        self.liveness = Liveness(timeout_s=1.0, misses=misses)
        self.quiet, self.ticks, self.stacks = set(), 0, []

    def statistics_within(self, names):
        self.ticks += 1
        return {name: NO_ANSWER if name in self.quiet else {"tick": self.ticks} for name in names}

    def statistics(self, name):
        raise AssertionError(f"waited for {name} without a deadline")

    def log_stacks(self, name):
        self.stacks.append(name)

    def is_dead(self, error):
        return False


def test_a_silent_actor_stands_in_with_its_last_statistics_then_is_restarted_as_hung():
    cluster, restarted = Silent(misses=3), []

    def recover(name, error):
        restarted.append((name, error))
        cluster.quiet.discard(name)  # its successor answers
        return {"tick": "restarted"}

    names = ["replay", "learner"]
    assert statistics_or_recover(cluster, names, recover) == {"replay": {"tick": 1}, "learner": {"tick": 1}}
    cluster.quiet.add("replay")
    for tick in (2, 3):  # silent: what it said last, and the run goes on
        assert statistics_or_recover(cluster, names, recover) == {"replay": {"tick": 1}, "learner": {"tick": tick}}
        assert cluster.liveness.silent() == ["replay"] and not restarted
    stats = statistics_or_recover(cluster, names, recover)  # the third check in a row
    assert stats["replay"] == {"tick": "restarted"} and cluster.stacks == ["replay"]
    assert [(name, type(error)) for name, error in restarted] == [("replay", HungActor)]
    assert "answered none of its last 3 health checks within 1 s" in str(restarted[0][1])
    assert cluster.liveness.silent() == []
    assert statistics_or_recover(cluster, names, recover)["replay"]["tick"] > 4  # answering again: counted afresh
    assert cluster.liveness.missed == {}


def test_an_actor_that_answers_again_starts_its_count_afresh():
    cluster = Silent(misses=2)
    statistics_or_recover(cluster, ["env-0"], lambda name, error: pytest.fail("restarted"))
    for _ in range(3):  # silent once, then answers: never two in a row
        cluster.quiet.add("env-0")
        statistics_or_recover(cluster, ["env-0"], lambda name, error: pytest.fail("restarted"))
        cluster.quiet.clear()
        statistics_or_recover(cluster, ["env-0"], lambda name, error: pytest.fail("restarted"))
    assert cluster.liveness.missed == {}


def test_the_deadline_and_the_misses_are_checked_with_the_config():
    run = load_config([]).run
    assert (run.ping_timeout_s, run.ping_misses) == (30.0, 3)
    with pytest.raises(ValueError, match="run.ping_timeout_s=0.0: must be > 0"):
        load_config(["run.ping_timeout_s=0"])
    with pytest.raises(ValueError, match="run.ping_misses=0: must be >= 1"):
        load_config(["run.ping_misses=0"])


class GroupCluster:
    """A learner group whose rank 1 died: rank 0 ends too, and restarting rank 0 restarts the whole group."""

    liveness = Liveness(timeout_s=1.0, misses=3)

    def __init__(self):
        self.alive = {"learner": False, "learner-rank1": False, "replay": True}

    def statistics_within(self, names):
        return {name: {"up": True} if self.alive[name] else Died(name) for name in names}

    def is_dead(self, error):
        return isinstance(error, Died)


class Died(Exception):
    pass


def test_answers_asked_before_a_restart_are_asked_again_after_it():
    """The check asks every actor at once; restarting the learner restarts its ranks too, so rank 1's answer from
    before it (dead) is asked again, not taken for a second death (which restarted the new group once more)."""
    cluster, restarted = GroupCluster(), []

    def recover(name, error):
        restarted.append(name)
        cluster.alive.update({"learner": True, "learner-rank1": True})  # the group, restarted as a whole
        return {"up": "restarted"}

    stats = statistics_or_recover(cluster, ["learner", "learner-rank1", "replay"], recover)
    assert restarted == ["learner"] and stats["learner-rank1"] == {"up": True}
