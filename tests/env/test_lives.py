"""A run's lives: episode ids carry the life (never the same twice in a run directory), and a resumed run's env
actors count the episodes its replay took over as started."""

from types import SimpleNamespace

from actors.env.admission import Admission, admission_share
from actors.env.actor import EnvActor, EnvConfig
from actors.runs.inherited import count_inherited
from actors.replay.spill import episode_life, episode_source


def ids(life: str, incarnation: int = 0, count: int = 3) -> list[str]:
    env = EnvActor(EnvConfig(tokenizer_path="unused", life=life, incarnation=incarnation), name="env-1")
    return [env.episode_id() for _ in range(count)]


def test_episode_ids_carry_the_life_and_never_repeat_across_lives():
    first, resumed = ids("20250101-120000"), ids("20250101-130000")
    assert first == ["20250101-120000/env-1-0-0", "20250101-120000/env-1-0-1", "20250101-120000/env-1-0-2"]
    assert not set(first) & set(resumed)  # each life's env-1 counts from 0 again, under its own life
    assert not set(first) & set(ids("20250101-120000", incarnation=1))  # a restart within a life, as before
    assert {episode_source(i) for i in first + resumed} == {"env-1"}  # the env actor, whatever the life
    assert episode_life(first[0]) == "20250101-120000" and episode_life("env-1-0-0") == ""


class Cluster:
    """Env actors' admissions, reached as the launcher's cluster reaches them."""

    def __init__(self, inherited: int, envs: int, version: int, batch: int):
        self.admissions = {f"env-{i}": Admission("main", max_staleness=0, batch_episodes=batch, slot=(i, envs),
                                                 versions={"main": version}) for i in range(envs)}
        self.inherited, self.configs = inherited, {}

    def statistics(self, name):
        return {"inherited_episodes": self.inherited} if name == "replay" else self.admissions[name].statistics()

    def reconfigure(self, name, **changes):
        self.configs[name] = changes

    def call(self, name, method, *args):
        return getattr(self.admissions[name], method)(*args)


def test_episodes_taken_over_count_as_started_so_new_ones_wait_for_the_learner():
    """eta = 0, batches of 4, the learner at version 5 with 6 episodes taken over: its allowance (24 episodes, 20 of
    them consumed before this life) is full; at version 6 two new ones may start, at version 7 six."""
    cluster = Cluster(inherited=6, envs=3, version=5, batch=4)
    top = SimpleNamespace(groups={"main": SimpleNamespace(replay="replay")}, envs=list(cluster.admissions))
    assert count_inherited(cluster, top) == 6
    started = [a.statistics()["started"] for a in cluster.admissions.values()]
    assert started == [admission_share(5 * 4 + 6, i, 3) for i in range(3)] and sum(started) == 26
    assert all(not a.admitted() for a in cluster.admissions.values())
    for a in cluster.admissions.values():
        a.set_version("main", 7)
    assert sum(a.limit("main") - a.statistics()["started"] for a in cluster.admissions.values()) == 6
    # a restart of each counts the same (its offset, beside what it delivers)
    assert [c["admission_offset"] for c in cluster.configs.values()] == started
