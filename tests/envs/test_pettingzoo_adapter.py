"""Every multi-agent game as a PettingZoo AEC environment, checked by PettingZoo's own api_test."""

import numpy as np
import pytest

pytest.importorskip("pettingzoo")
from pettingzoo.test import api_test  # noqa: E402

from envs.pettingzoo_adapter import aec_env  # noqa: E402

GAMES = [("tictactoe", {}), ("kuhn_poker", {}), ("negotiation", {}), ("liars_dice", {}),
         ("liars_dice", {"players": 6, "dice": 1}), ("secret_keeper", {})]


@pytest.mark.parametrize("name,kwargs", GAMES)
def test_pettingzoo_api_test_passes(name, kwargs):
    api_test(aec_env(name, **kwargs), num_cycles=200)


@pytest.mark.parametrize("name,kwargs", GAMES)
def test_masked_random_play_is_zero_sum_and_seeded(name, kwargs):
    def play(seed):
        env = aec_env(name, **kwargs)
        env.reset(seed=seed)
        rng, total, texts = np.random.default_rng(seed), {a: 0.0 for a in env.possible_agents}, []
        for agent in env.agent_iter(max_iter=2000):
            observation, reward, terminated, truncated, _ = env.last()
            total[agent] += reward
            texts.append(env.observe_text(agent))
            if terminated or truncated:
                env.step(None)
                continue
            legal = np.flatnonzero(observation["action_mask"])
            env.step(int(rng.choice(legal)))
        assert not env.agents  # the game ended and every agent stepped out
        return total, texts

    total, texts = play(3)
    assert sum(total.values()) == pytest.approx(0.0)
    assert play(3) == (total, texts) and play(4) != (total, texts)


def test_observations_are_private():
    env = aec_env("kuhn_poker")
    env.reset(seed=1)
    cards = env.game.game.cards
    assert f"Your card: {'JQK'[cards[0]]}" in env.observe_text("player_0")
    assert f"Your card: {'JQK'[cards[0]]}" not in env.observe_text("player_1")
    observed = bytes(env.observe("player_0")["observation"]).rstrip(b"\0").decode()
    assert observed == env.observe_text("player_0")


def test_single_agent_environments_are_refused():
    with pytest.raises(ValueError, match="single-agent"):
        aec_env("guess_number")
