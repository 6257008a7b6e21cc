"""The two interfaces tidal environments speak.

``Env`` is the single-agent interface of GEM (and Gymnasium) with text actions: ``reset(seed) -> (observation,
info)`` and ``step(action) -> (observation, reward, terminated, truncated, info)``. ``step`` may also be a
coroutine function (a tool call that waits on I/O); the env actor awaits it.

``Game`` is the turn-based interface for n players: whose turn it is (``current_player``), each player's own
observation (private information stays private), per-player rewards in every ``StepResult``, the outcome in
the last one's ``info``. The env actor plays both: a single-agent ``Env`` is seated as a one-player game by
``envs.single_agent.SingleAgentGame``.

An action a game cannot read, or one its rules forbid, is reported as ``StepResult(invalid=True)`` and changes
nothing; ``envs.invalid.InvalidActions`` (applied by ``envs.make``) turns that into a penalty, retries and a
forfeit, the same way for every game.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Awaitable, Protocol


@dataclass
class StepResult:
    """What one move did. ``rewards`` has one entry per seat: what each seat earned by this move."""

    rewards: list[float]
    terminated: bool
    truncated: bool = False
    invalid: bool = False
    info: dict = field(default_factory=dict)


class Game(Protocol):
    """A turn-based text game with ``num_players`` seats (roles are given by the prompt).

    ``step`` returns a StepResult, or an awaitable of one. A game may also have a ``max_tokens`` attribute:
    the generation budget of the current turn (the env actor's default when absent or None), and a ``roles``
    attribute: a role name per seat (``["proposer", "solver", "solver"]``), written on each row of the seat
    (``role``), which keys the seat's advantage baseline instead of its index: seats of one role share it. A
    game where one seat's forfeit need not end the episode has ``forfeit_turn()`` (``envs.invalid``).
    """

    name: str
    num_players: int

    def reset(self, seed: int) -> None: ...

    @property
    def current_player(self) -> int: ...

    def observation(self, player: int) -> str: ...

    def step(self, action_text: str) -> StepResult | Awaitable[StepResult]: ...

    def legal_actions(self) -> list[str]: ...


class Env(Protocol):
    """A single-agent text environment, as in GEM: multi-turn until ``terminated`` or ``truncated``.

    ``info["invalid_action"] = True`` from ``step`` says the action could not be read and changed nothing.
    """

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]: ...

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]: ...
