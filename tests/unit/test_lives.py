"""A run's lives: episode ids carry the life (never the same twice in a run directory)."""

from actors.env import EnvActor, EnvConfig
from actors.spill import episode_life, episode_source


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
