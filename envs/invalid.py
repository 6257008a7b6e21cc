"""Invalid actions, the same way in every game: a penalty, then a number of retries, then a forfeit.

A game reports an action it cannot read, or one its rules forbid, as ``StepResult(invalid=True)`` and does
not change. This wrapper decides what that costs the mover:

- while it has retries left (``max_retries`` per turn), the mover gets ``retry_penalty`` and moves again; its
  next observation starts with a note saying what was wrong;
- after that, the invalid action is a forfeit: the episode ends, the mover gets ``invalid_penalty`` and
  every other seat 0.

A game where a forfeit need not end the episode (one of several solvers gives up: the others still answer)
has ``forfeit_turn()``: called on a forfeit, it moves the game past the mover's turn and returns that step's
``StepResult`` (the mover's ``invalid_penalty`` is added to it), or None to end the episode as above.

With ``max_retries=0`` (the default) the first invalid action is a forfeit. Every invalid action is still
a ``StepResult`` with ``invalid=True``, so the env actor counts them.

A completion in which the env's answer form (``envs.answers``) finds no answer never reaches the game:
``unreadable`` judges it as an invalid action here, the same way, with ``info["unreadable"]`` set.
"""

from __future__ import annotations

from envs.base import Game, StepResult


class InvalidActions:
    def __init__(self, game: Game, invalid_penalty: float = -1.0, max_retries: int = 0, retry_penalty: float = -0.1):
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, not {max_retries}")
        self.game = game
        self.invalid_penalty, self.max_retries, self.retry_penalty = invalid_penalty, max_retries, retry_penalty
        self.done = False
        self._retries = 0  # used in the current turn
        self._note = ""

    def __getattr__(self, name):  # name, num_players, legal_actions, max_tokens, rules' own state...
        return getattr(self.game, name)

    @property
    def current_player(self) -> int:
        return self.game.current_player

    @property
    def num_players(self) -> int:  # asked every episode, and a turn's budget every turn: not through __getattr__
        return self.game.num_players

    @property
    def max_tokens(self) -> int | None:
        return getattr(self.game, "max_tokens", None)

    def legal_actions(self) -> list[str]:
        return self.game.legal_actions()

    def reset(self, seed: int = 0) -> None:
        self.game.reset(seed)
        self.done, self._retries, self._note = False, 0, ""

    def observation(self, player: int) -> str:
        text = self.game.observation(player)
        return self._note + text if player == self.game.current_player else text

    def step(self, action_text: str):
        if self.done:
            raise RuntimeError("step() on a finished game; call reset() first")
        mover = self.game.current_player
        result = self.game.step(action_text)
        if not isinstance(result, StepResult):  # a coroutine step
            return self._judge_later(result, mover, action_text)
        return self._judge(result, mover, action_text)

    def unreadable(self, action_text: str, reason: str) -> StepResult:
        """A completion with no answer in it (``envs.answers``), judged as an invalid action the game never sees:
        the game does not change; ``reason`` says what was missing in the retry's note."""
        if self.done:
            raise RuntimeError("unreadable() on a finished game; call reset() first")
        missing = StepResult([0.0] * self.game.num_players, terminated=False, invalid=True,
                             info={"reason": reason, "unreadable": True})
        return self._judge(missing, self.game.current_player, action_text)

    async def _judge_later(self, pending, mover: int, action_text: str) -> StepResult:
        return self._judge(await pending, mover, action_text)

    def _judge(self, result: StepResult, mover: int, action_text: str) -> StepResult:
        if not result.invalid:
            self._retries, self._note = 0, ""
            self.done = result.terminated or result.truncated
            return result
        rewards = [0.0] * len(result.rewards)
        if self._retries < self.max_retries:
            self._retries += 1
            left = self.max_retries - self._retries
            self._note = (f"Your answer {action_text.strip()[:40]!r} is not a valid move"
                          f"{': ' + result.info['reason'] if result.info.get('reason') else ''}. "
                          f"Try again ({left} more tries after this one).\n")
            rewards[mover] = self.retry_penalty
            return StepResult(rewards, terminated=False, invalid=True, info={**result.info, "retries_left": left})
        rewards[mover] = self.invalid_penalty
        forfeit_turn = getattr(self.game, "forfeit_turn", None)
        after = forfeit_turn() if forfeit_turn is not None else None
        if after is not None:  # the game goes on without the mover's move
            self._retries, self._note = 0, ""
            self.done = after.terminated or after.truncated
            return StepResult([r + a for r, a in zip(rewards, after.rewards)], after.terminated, after.truncated,
                              invalid=True, info={**result.info, **after.info, "forfeit": mover})
        self.done = True
        return StepResult(rewards, terminated=True, invalid=True, info={**result.info, "forfeit": mover})
