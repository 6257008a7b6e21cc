"""Each multi-agent tidal game as a PettingZoo AEC environment (``pip install pettingzoo``).

    from envs.pettingzoo_adapter import aec_env
    env = aec_env("liars_dice", players=4)

An agent ``player_<seat>`` observes a dict: ``observation``, its own prompt text as UTF-8 bytes zero-padded
to ``max_bytes`` (``env.observe_text(agent)`` gives the text itself), and ``action_mask`` over the game's
action vocabulary. Actions are indices into ``env.vocabulary`` (the bracketed move texts); a masked-out
action is an invalid move, with tidal's retry and forfeit rules (``max_retries`` etc. go to ``envs.make``), except
in a game whose every message is a move (``secret_keeper``: the mask is the seat's menu); an index outside the
action space is a caller's error (``ValueError``).
Rewards are the game's per-seat rewards; when the game ends every agent is terminated (or truncated).
"""

from __future__ import annotations

import random

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv

import envs


def aec_env(name: str, max_bytes: int = 1024, **kwargs) -> TidalAEC:
    return TidalAEC(name, max_bytes=max_bytes, **kwargs)


class TidalAEC(AECEnv):
    metadata = {"render_modes": ["human"], "is_parallelizable": False}

    def __init__(self, name: str, max_bytes: int = 1024, render_mode: str | None = None, **kwargs):
        super().__init__()
        self.game = envs.make(name, **kwargs)
        if self.game.num_players < 2:
            raise ValueError(f"{name!r} is a single-agent environment; PettingZoo adapts multi-agent games")
        self.metadata = {**self.metadata, "name": name}
        self.name, self.max_bytes, self.render_mode = name, max_bytes, render_mode
        self.vocabulary = self.game.action_vocabulary()
        self.possible_agents = [f"player_{seat}" for seat in range(self.game.num_players)]
        observation_space = spaces.Dict({
            "observation": spaces.Box(0, 255, (max_bytes,), np.uint8),
            "action_mask": spaces.Box(0, 1, (len(self.vocabulary),), np.int8),
        })
        self.observation_spaces = {agent: observation_space for agent in self.possible_agents}
        self.action_spaces = {agent: spaces.Discrete(len(self.vocabulary)) for agent in self.possible_agents}
        self._seeds = random.Random()

    def observation_space(self, agent: str) -> spaces.Space:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> spaces.Space:
        return self.action_spaces[agent]

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        if seed is not None:
            self._seeds.seed(seed)
        self.game.reset(self._seeds.randrange(2**31))
        self.agents = self.possible_agents[:]
        self.rewards = {agent: 0.0 for agent in self.agents}
        self._cumulative_rewards = {agent: 0.0 for agent in self.agents}
        self.terminations = {agent: False for agent in self.agents}
        self.truncations = {agent: False for agent in self.agents}
        self.infos = {agent: {} for agent in self.agents}
        self.agent_selection = self.possible_agents[self.game.current_player]

    def observe_text(self, agent: str) -> str:
        return self.game.observation(self.possible_agents.index(agent))

    def observe(self, agent: str) -> dict:
        encoded = self.observe_text(agent).encode()[: self.max_bytes]
        text = np.zeros(self.max_bytes, np.uint8)
        text[: len(encoded)] = np.frombuffer(encoded, np.uint8)
        mask = np.zeros(len(self.vocabulary), np.int8)
        to_move = self.possible_agents[self.game.current_player] == agent and not self.game.done
        if to_move:
            legal = set(self.game.legal_actions())
            mask[[i for i, action in enumerate(self.vocabulary) if action in legal]] = 1
        return {"observation": text, "action_mask": mask}

    def step(self, action) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        index = int(action)
        if not 0 <= index < len(self.vocabulary):  # a negative index would play a move from the list's end
            raise ValueError(f"action {action!r} is outside the action space, Discrete({len(self.vocabulary)})")
        result = self.game.step(self.vocabulary[index])
        self._cumulative_rewards[agent] = 0.0
        self.rewards = dict(zip(self.possible_agents, map(float, result.rewards)))
        if result.terminated or result.truncated:
            for name in self.agents:
                self.terminations[name], self.truncations[name] = result.terminated, result.truncated
                self.infos[name] = {"outcome": {k: v for k, v in result.info.items() if k != "reason"}}
            self.agent_selection = self.agents[0]
        else:
            self.agent_selection = self.possible_agents[self.game.current_player]
        self._accumulate_rewards()
        if self.render_mode == "human":
            self.render()

    def render(self) -> None:
        if self.render_mode == "human" and self.agents:
            print(self.observe_text(self.agent_selection))

    def close(self) -> None:
        pass
