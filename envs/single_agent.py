"""A single-agent ``Env`` (GEM's interface) seated as a one-player ``Game``, so the env actor plays both alike.

Any object with GEM's ``reset``/``step`` works unchanged, a GEM environment included; a coroutine ``step``
is awaited. The observation the env returns is the next prompt.

An env without ``legal_actions`` names a random action by GEM's ``sample_random_action``, which draws from the
global ``random`` module that every env in the process shares. So that an episode's random actions depend on
its seed only, however the env actor interleaves episodes, each draw reseeds ``random`` from the episode's
seed and the draw's number first (NumPy's global generator is not reseeded).
"""

from __future__ import annotations

import random

from envs.base import Env, StepResult

INVALID_KEY = "invalid_action"  # info key by which an Env says an action changed nothing


class SingleAgentGame:
    num_players = 1
    current_player = 0

    def __init__(self, env: Env, name: str | None = None):
        self.env = env
        self.name = name or getattr(env, "name", type(env).__name__)
        self._observation = ""
        self.info: dict = {}
        self._legal_actions = getattr(env, "legal_actions", None)
        self._seed, self._draws = 0, 0  # random actions drawn in this episode
        self._budgeted = hasattr(env, "max_tokens")  # whether the env names a turn's budget (asked again at reset)

    def __getattr__(self, name):  # the env's own extras, e.g. expert_action()
        if name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)

    def reset(self, seed: int = 0) -> None:
        self._observation, self.info = self.env.reset(seed=seed)
        self._seed, self._draws = seed, 0
        self._budgeted = hasattr(self.env, "max_tokens")

    def observation(self, player: int = 0) -> str:
        return self._observation

    def legal_actions(self) -> list[str]:
        if self._legal_actions is not None:
            return self._legal_actions()
        random.seed((self._seed << 32) + self._draws)  # see the module's docstring
        self._draws += 1
        return [self.env.sample_random_action()]  # GEM's way to name an action

    @property
    def max_tokens(self) -> int | None:
        """The env's budget for this turn, if it names one (an env without the attribute at its reset has none:
        asked every turn, a missing attribute costs a failed lookup through every wrapper of a GEM env)."""
        return getattr(self.env, "max_tokens", None) if self._budgeted else None

    def step(self, action_text: str):
        outcome = self.env.step(action_text)
        if not isinstance(outcome, (tuple, list)):  # a coroutine step
            return self._result_later(outcome)
        return self._result(outcome)

    async def _result_later(self, pending) -> StepResult:
        return self._result(await pending)

    def _result(self, outcome) -> StepResult:
        observation, reward, terminated, truncated, info = outcome
        self._observation, self.info = str(observation), dict(info)
        return StepResult([float(reward)], bool(terminated), bool(truncated), bool(info.get(INVALID_KEY)), self.info)
