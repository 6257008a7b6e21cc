"""A single-agent ``Env`` (GEM's interface) seated as a one-player ``Game``, so the env actor plays both alike.

Any object with GEM's ``reset``/``step`` works unchanged, a GEM environment included; a coroutine ``step``
is awaited. The observation the env returns is the next prompt.
"""

from __future__ import annotations

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

    def __getattr__(self, name):  # the env's own extras, e.g. expert_action()
        if name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)

    def reset(self, seed: int = 0) -> None:
        self._observation, self.info = self.env.reset(seed=seed)

    def observation(self, player: int = 0) -> str:
        return self._observation

    def legal_actions(self) -> list[str]:
        legal = getattr(self.env, "legal_actions", None)
        if legal is not None:
            return legal()
        return [self.env.sample_random_action()]  # GEM's way to name an action

    @property
    def max_tokens(self) -> int | None:
        return getattr(self.env, "max_tokens", None)

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
