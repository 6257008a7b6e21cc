"""Guess the Number: a single-agent, multi-turn task with feedback.

A hidden whole number lies in ``low..high``. Each turn the agent guesses, e.g. ``[37]``, and hears whether
the number is higher or lower. Finding it ends the episode with reward 1; after ``max_turns`` wrong guesses
it is truncated with reward 0. A guess that is unreadable (``[--5]``, ``[²]``, more digits than the bounds
have) or out of range is invalid and changes nothing.
"""

from __future__ import annotations

import random

from envs.actions import MAX_DIGITS, bracket, first_move, read_int


class GuessNumber:
    name = "guess_number"

    def __init__(self, low: int = 1, high: int = 50, max_turns: int = 7):
        if low >= high or max_turns < 1:
            raise ValueError(f"need low < high and max_turns >= 1, got low={low} high={high} max_turns={max_turns}")
        self.low, self.high, self.max_turns = low, high, max_turns
        self._digits = max(MAX_DIGITS, len(str(abs(low))), len(str(abs(high))))

    def reset(self, seed: int | None = None) -> tuple[str, dict]:
        self.target = random.Random(seed).randint(self.low, self.high)
        self.feedback: list[str] = []
        return self._observation(), {}

    def _read(self, inside: str) -> int | None:
        number = read_int(inside, signed=True, max_digits=self._digits)
        return number if number is not None and self.low <= number <= self.high else None

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        guess = first_move(action, self._read)
        if guess is None:
            reason = f"guess a whole number from {self.low} to {self.high} in brackets, e.g. [{self.low}]"
            return self._observation(), 0.0, False, False, {"invalid_action": True, "reason": reason}
        if guess == self.target:
            return f"{guess} is right.", 1.0, True, False, {"turns": len(self.feedback) + 1}
        self.feedback.append(f"{guess}: the number is {'higher' if self.target > guess else 'lower'}")
        truncated = len(self.feedback) >= self.max_turns
        return self._observation(), 0.0, False, truncated, {}

    def legal_actions(self) -> list[str]:
        return [bracket(str(n)) for n in range(self.low, self.high + 1)]

    def _observation(self) -> str:
        said = "; ".join(self.feedback) or "no guesses yet"
        return (f"Guess the number from {self.low} to {self.high}; "
                f"{self.max_turns - len(self.feedback)} guesses left.\nSo far: {said}.\nGuess, e.g. [{self.low}]:")
