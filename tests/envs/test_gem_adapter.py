"""GEM environments (PyPI gem-llm) run unchanged inside tidal: through make, the env actor, and a short run."""

import pytest

pytest.importorskip("gem")

import envs  # noqa: E402
from actors.runs.host import LocalCluster  # noqa: E402
from actors.runs.topology import build_topology  # noqa: E402
from streams.schema import Columns  # noqa: E402
from tests.factories import run_episodes  # noqa: E402
from tests.factories import wait_for  # noqa: E402
from tests.factories import small_config  # noqa: E402

GAME = "gem:game:GuessTheNumber-v0-easy"  # 1 to 10, four guesses


def test_a_gem_environment_is_a_seeded_one_player_game():
    def play(seed):
        game = envs.make(GAME)
        game.reset(seed)
        transcript = [game.observation(0)]
        for guess in range(1, 5):
            result = game.step(f"I guess \\boxed{{{guess}}}")
            transcript.append((game.observation(0), result.rewards, result.terminated))
            if result.terminated:
                break
        return transcript

    assert envs.make(GAME).num_players == 1
    assert play(3) == play(3) and "Guess The Number" in play(3)[0]
    assert any(play(seed) != play(3) for seed in range(4, 10))
    with pytest.raises(ValueError, match="unknown GEM environment"):
        envs.make("gem:game:NoSuchGame-v0")


def test_the_random_player_of_a_gem_game_is_reproducible_from_the_episode_seed():
    """GEM draws random actions from the global ``random``; other episodes drawing in between change nothing."""
    import random

    def play(seed, interleave=False):
        game, other, player = envs.make("gem:game:GuessTheNumber-v0-hard"), envs.make(GAME), envs.make_opponent("random")
        game.reset(seed)
        moves = []
        while True:
            if interleave:  # another episode starts and moves, and someone else draws, between this one's moves
                other.reset(seed + len(moves) + 1)
                other.step(player.act(other))
                random.random()
            moves.append(player.act(game))
            if (result := game.step(moves[-1])).terminated or result.truncated:
                return moves

    assert play(5) == play(5, interleave=True) and len(play(5)) > 1
    assert len({tuple(play(seed, interleave=True)) for seed in range(6)}) > 1


def test_the_env_actor_hosts_a_gem_game_and_keeps_its_rewards(tiny_model_dir):
    *episodes, stats = run_episodes(tiny_model_dir, "\\boxed{3}", episodes=12, env_name=GAME, max_prompt_tokens=96,
                                    answer="boxed")
    outcomes = set()
    for table in episodes:
        rows = table.to_pylist()
        assert all(len(r[Columns.PROMPT_IDS]) <= 96 for r in rows) and rows[-1][Columns.TERMINATED]
        assert sum(r[Columns.REWARD] for r in rows) == pytest.approx(rows[0][Columns.EPISODE_RETURN])
        outcomes.add(len(rows))
    # the same guess every turn: right at once when the number is 3, else repeated until GEM's fourth turn
    assert outcomes <= {1, 4} and 4 in outcomes and stats["errored"] == 0 and stats["truncated_prompts"] > 0


def test_a_gem_game_trains_in_a_short_run_over_real_sockets(tiny_model_dir, tmp_path):
    cfg = small_config(tmp_path, env="gem")
    cluster = LocalCluster(transport="zmq")
    try:
        top = build_topology(cluster, cfg, tiny_model_dir, tmp_path)
        cluster.call(top.envs[0], "set_training", True)
        wait_for(lambda: cluster.statistics("learner")["version"] >= 3, "three learner updates on GEM episodes")
        env = cluster.statistics(top.envs[0])
        assert env["episodes"] >= 24 and env["errored"] == 0
        assert cluster.statistics("learner")["episodes"] >= 24
    finally:
        cluster.shutdown()


def test_a_gem_game_reads_the_last_box_after_the_reasoning_and_never_sees_an_unreadable_one():
    import trio

    from actors.env.episode import EpisodeCounts, EpisodeSettings, play_episode
    from streams.messages import Completion

    class Codec:
        def encode(self, text):
            return [ord(c) for c in text]

        def decode(self, ids):
            return "".join(map(chr, ids))

    def play(write, seed):
        prompts, counts, game = [], EpisodeCounts(1), envs.make(GAME)

        async def policy(prompt_ids, max_tokens, member):
            prompts.append(Codec().decode(prompt_ids))
            tokens = Codec().encode(write)
            return Completion(len(prompts), tokens, [0.0] * len(tokens), [0] * len(tokens), True)

        settings = EpisodeSettings(GAME, 64, answer="think_boxed", format_penalty=-0.5)
        rows, returns = trio.run(lambda: play_episode(game, ["main"], policy, Codec(), settings, episode_id="g",
                                                      seed=seed, learner="main", counts=counts))
        return prompts, returns, counts.counts, game

    for seed in range(10):  # a seed whose number is not 5: the guess is answered in the next prompt
        prompts, _, counts, _ = play("<think>\\boxed{1}</think> \\boxed{2}, no: \\boxed{5}", seed)
        if len(prompts) > 1:
            break
    assert "you guessed 5" in prompts[1] and counts["unreadable_actions"] == 0
    prompts, returns, counts, game = play("I guess \\boxed{5}", 0)  # no </think>: no answer
    assert returns == [-1.5] and counts["unreadable_actions"] == 1 == counts["forfeits"]
    assert game.env.turn_count == 0  # GEM never saw the completion


def test_a_single_agent_game_gives_the_budget_its_env_names_and_none_for_one_that_names_none():
    """A turn's budget is asked every turn through the wrappers (``InvalidActions`` over ``SingleAgentGame``): an env
    with no ``max_tokens`` at its reset has none, one that names it (at construction or at reset) is followed turn
    by turn."""
    from envs.invalid import InvalidActions
    from envs.single_agent import SingleAgentGame

    class Budgets:
        def __init__(self, at_init: bool):
            if at_init:
                self.max_tokens = 5

        def reset(self, seed=0):
            self.max_tokens = 7 + seed
            return "start", {}

        def step(self, action):
            self.max_tokens = 11
            return "next", 0.0, False, False, {}

    class NoBudget:
        def reset(self, seed=0):
            return "start", {}

        def step(self, action):
            return "next", 0.0, False, False, {}

    for at_init in (True, False):
        game = InvalidActions(SingleAgentGame(Budgets(at_init)))
        assert game.num_players == 1
        game.reset(2)
        assert game.max_tokens == 9
        game.step("[1]")
        assert game.max_tokens == 11
    plain = InvalidActions(SingleAgentGame(NoBudget()))
    plain.reset(0)
    assert plain.max_tokens is None and plain.num_players == 1
    assert envs.make(GAME).max_tokens is None
