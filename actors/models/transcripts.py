"""Transcripts of play: the text a base model is warmed up on, and a tokenizer trained on."""

from __future__ import annotations

import inspect
import random

import trio
from trio.testing import MockClock

from envs.registry import make, make_opponent


def demonstrations(env_name: str, games: int, seed: int, env_args: dict | None = None,
                   expert_share: float = 0.0) -> list[tuple[str, str]]:
    """(prompt, answer) pairs from episodes where every seat plays a random legal action, or with probability
    ``expert_share`` the environment's ``expert_action()`` when it has one (and it names a move: None is no
    opinion, and a random legal action is played).

    Episodes run on a trio loop with a mock clock, so an environment whose steps sleep (a slow tool) costs
    no wall time here.
    """
    rng = random.Random(seed)
    opponent = make_opponent("random", seed=seed)

    async def play_all() -> list[tuple[str, str]]:
        pairs = []
        for _ in range(games):
            game = make(env_name, **(env_args or {}))
            game.reset(rng.randrange(2**31))
            expert = getattr(game, "expert_action", None)
            done = False
            while not done:
                prompt = game.observation(game.current_player)
                use_expert = expert is not None and rng.random() < expert_share
                action = (expert() if use_expert else None) or opponent.act(game)
                pairs.append((prompt, action))
                result = game.step(action)
                if inspect.isawaitable(result):
                    result = await result
                done = result.terminated or result.truncated
        return pairs

    return trio.run(play_all, clock=MockClock(autojump_threshold=0))
