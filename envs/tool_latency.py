"""A tool-use task whose tool calls take a heavy-tailed time: the workload of the asynchrony benchmarks.

The agent must report the sum of the values of ``lookups`` names. Values are hidden behind a lookup tool:

- ``[lookup NAME]`` calls the tool. It answers after a latency drawn from a log-normal distribution (median
  ``latency_median_s``, shape ``latency_sigma``, capped at ``latency_max_s``): an async sleep, so an env actor
  keeps serving its other episodes meanwhile. The answer joins the observation; reward 0.
- ``[answer NUMBER]`` ends the task: reward 1 if NUMBER is the sum, else 0.

Anything else is invalid and changes nothing: names and numbers are ASCII, a number at most
``envs.actions.MAX_DIGITS`` digits (``[answer ٤٢]`` or a thousand digits is invalid; ``[answer apple]`` is a
wrong answer). After ``max_turns`` actions the episode is truncated (reward 0).
Each turn's generation budget (``max_tokens``) is drawn from ``min_new_tokens..max_new_tokens`` when both are
set, so generation lengths vary too. Everything random comes from the seed given to ``reset``.
"""

from __future__ import annotations

import math
import random
import re

import trio

from envs.actions import MAX_DIGITS, read_int

NAMES = ("apple", "river", "stone", "cloud", "tiger", "maple", "ember", "frost", "coral", "delta", "prism", "quill")
ACTION = re.compile(r"\[\s*(lookup|answer)\s+([a-z]+|-?[0-9]{1,%d})\s*\]" % MAX_DIGITS, re.IGNORECASE | re.ASCII)


class ToolLatencyTask:
    name = "tool_latency"

    def __init__(self, lookups: int = 2, max_turns: int = 6, latency_median_s: float = 0.05,
                 latency_sigma: float = 1.0, latency_max_s: float = 5.0,
                 min_new_tokens: int | None = None, max_new_tokens: int | None = None):
        if not 1 <= lookups <= len(NAMES):
            raise ValueError(f"lookups must be in 1..{len(NAMES)}, not {lookups}")
        if latency_median_s < 0 or latency_sigma < 0 or latency_max_s < 0:
            raise ValueError("latency_median_s, latency_sigma and latency_max_s must be >= 0")
        if (min_new_tokens is None) != (max_new_tokens is None) or (min_new_tokens or 0) > (max_new_tokens or 0):
            raise ValueError("set both min_new_tokens <= max_new_tokens, or neither")
        self.lookups, self.max_turns = lookups, max_turns
        self.latency_median_s, self.latency_sigma, self.latency_max_s = latency_median_s, latency_sigma, latency_max_s
        self.token_range = (min_new_tokens, max_new_tokens) if min_new_tokens is not None else None
        self.max_tokens: int | None = None
        self.latencies: list[float] = []  # of every tool call so far, for tests and metrics

    def reset(self, seed: int | None = None) -> tuple[str, dict]:
        self.rng = random.Random(seed)
        self.values = {name: self.rng.randint(1, 99) for name in NAMES}
        self.asked = self.rng.sample(NAMES, self.lookups)
        self.known: dict[str, int] = {}
        self.turns = 0
        self.latencies = []
        self._draw_budget()
        return self._observation(), {}

    def draw_latency(self) -> float:
        if self.latency_median_s == 0:
            return 0.0
        return min(self.latency_median_s * math.exp(self.rng.gauss(0.0, self.latency_sigma)), self.latency_max_s)

    async def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        match = ACTION.search(action)
        if match is None or (match.group(1).lower() == "lookup" and match.group(2).lower() not in self.values):
            reason = "use [lookup NAME] or [answer NUMBER]" if match is None else f"no value named {match.group(2)!r}"
            return self._observation(), 0.0, False, False, {"invalid_action": True, "reason": reason}
        self.turns += 1
        tool, argument = match.group(1).lower(), match.group(2).lower()
        if tool == "answer":
            correct = read_int(argument, signed=True) == self.answer
            return self._observation(), float(correct), True, False, {"correct": correct}
        latency = self.draw_latency()
        self.latencies.append(latency)
        await trio.sleep(latency)  # the tool is slow; other episodes go on meanwhile
        self.known[argument] = self.values[argument]
        self._draw_budget()
        return self._observation(), 0.0, False, self.turns >= self.max_turns, {"latency_s": latency}

    def legal_actions(self) -> list[str]:
        return [f"[lookup {name}]" for name in NAMES] + [f"[answer {self.answer}]"]

    def expert_action(self) -> str:
        """The shortest way to the reward: look up each asked value not yet known, then answer their sum."""
        missing = [name for name in self.asked if name not in self.known]
        return f"[lookup {missing[0]}]" if missing else f"[answer {self.answer}]"

    @property
    def answer(self) -> int:
        return sum(self.values[name] for name in self.asked)

    def _draw_budget(self) -> None:
        if self.token_range is not None:
            self.max_tokens = self.rng.randint(*self.token_range)

    def _observation(self) -> str:
        known = ", ".join(f"{name} = {value}" for name, value in self.known.items()) or "nothing yet"
        return (f"Find the sum of the values of {' and '.join(self.asked)}.\n"
                f"Tools: [lookup NAME] gives a value; [answer NUMBER] ends the task.\nKnown: {known}\nAction:")
