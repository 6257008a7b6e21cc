"""Countdown: reach a target with + - * / and given numbers, checked exactly.

The agent gets ``size`` numbers (from 1-10, 25, 50, 75, 100) and a target that some of them reach. It
answers with one expression in brackets, e.g. ``[(25 - 5) * 4]``, using each given number at most once (as
often as it is given). The verifier parses the expression (numbers, + - * /, parentheses: nothing else is
evaluated) and computes it in exact fractions: reward 1 if it equals the target, else 0, and the episode
ends. An expression that cannot be read is invalid (so is a number of more than ``MAX_DIGITS`` digits); one
that uses other numbers is a wrong answer, decided before anything is computed.

The parser is one pass with explicit stacks (shunting-yard), no ``eval`` and no recursion: a sum of 100,000
terms or 100,000 nested parentheses is read in time linear in its length, never a ``RecursionError``.
"""

from __future__ import annotations

import functools
import operator
import random
import re
from collections import Counter
from fractions import Fraction

from envs.actions import bracket, first_move, read_int

POOL = (*range(1, 11), 25, 50, 75, 100)
OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}
PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}
ALLOWED = frozenset("0123456789+-*/() ")
TOKEN = re.compile(r"[0-9]+|[^ ]")

Postfix = tuple[int | str, ...]  # numbers and operator symbols, in evaluation order


def parse_expression(text: str) -> Postfix | None:
    """The expression in postfix order if it is only whole numbers, + - * / and parentheses (no unary
    signs); else None."""
    if not text or not ALLOWED.issuperset(text):
        return None
    out: list[int | str] = []
    pending: list[str] = []  # operators and open parentheses not yet written out
    operand_next = True
    for token in TOKEN.findall(text):
        if token[0].isdigit():
            number = read_int(token)
            if not operand_next or number is None:
                return None
            out.append(number)
            operand_next = False
        elif token == "(":
            if not operand_next:
                return None
            pending.append(token)
        elif token == ")":
            if operand_next:
                return None
            while pending and pending[-1] != "(":
                out.append(pending.pop())
            if not pending:
                return None
            pending.pop()
        else:  # + - * /, left-associative
            if operand_next:
                return None
            while pending and pending[-1] != "(" and PRECEDENCE[pending[-1]] >= PRECEDENCE[token]:
                out.append(pending.pop())
            pending.append(token)
            operand_next = True
    if operand_next or "(" in pending:
        return None
    return (*out, *reversed(pending))


def evaluate(expression: Postfix) -> Fraction | None:
    """Exact value of a parsed expression; None on division by zero. (``step`` computes only expressions of
    the given numbers: a product of thousands of numbers would be slow, and its text too long for ``str``.)"""
    stack: list[Fraction] = []
    for item in expression:
        if isinstance(item, int):
            stack.append(Fraction(item))
            continue
        right, left = stack.pop(), stack.pop()
        if item == "/" and right == 0:
            return None
        stack.append(OPS[item](left, right))
    return stack[0]


def numbers_used(expression: Postfix) -> Counter:
    return Counter(item for item in expression if isinstance(item, int))


MAX_SEARCHED = 4  # ``reachable`` is exhaustive: 4 numbers make a few thousand values, 6 would make millions


@functools.lru_cache(maxsize=4096)
def reachable(numbers: tuple[int, ...]) -> dict[Fraction, str]:
    """Every value that some of ``numbers`` reach with + - * / (each given number at most once, as often as it is
    given), in exact fractions, each with one expression that reaches it (a text ``parse_expression`` reads).

    An exhaustive search over subsets: the values of a subset combine the values of each split of it into two.
    At most ``MAX_SEARCHED`` numbers (a ``ValueError`` beyond). Pass a sorted tuple to share the cache."""
    if not 1 <= len(numbers) <= MAX_SEARCHED:
        raise ValueError(f"reachable() searches 1 to {MAX_SEARCHED} numbers, not {len(numbers)}")
    count = len(numbers)
    values: list[dict[Fraction, str]] = [{} for _ in range(1 << count)]  # per subset (a bit mask)
    for i, n in enumerate(numbers):
        values[1 << i] = {Fraction(n): str(n)}
    for mask in range(1, 1 << count):
        if not mask & (mask - 1):  # one number: set above
            continue
        found = values[mask]
        part = (mask - 1) & mask
        while part:  # every split into two non-empty parts, each once (part < rest); both orders below
            rest = mask ^ part
            if part < rest:
                for a, text_a in values[part].items():
                    for b, text_b in values[rest].items():
                        for value, text in _combinations(a, text_a, b, text_b):
                            found.setdefault(value, text)
            part = (part - 1) & mask
    everything: dict[Fraction, str] = {}
    for found in values:
        for value, text in found.items():
            everything.setdefault(value, text[1:-1] if text.startswith("(") else text)
    return everything


def _combinations(a: Fraction, text_a: str, b: Fraction, text_b: str):
    yield a + b, f"({text_a} + {text_b})"
    yield a * b, f"({text_a} * {text_b})"
    yield a - b, f"({text_a} - {text_b})"
    yield b - a, f"({text_b} - {text_a})"
    if b:
        yield a / b, f"({text_a} / {text_b})"
    if a:
        yield b / a, f"({text_b} / {text_a})"


class Countdown:
    name = "countdown"

    def __init__(self, size: int = 4):
        if not 2 <= size <= 6:
            raise ValueError(f"size must be 2 to 6, not {size}")
        self.size = size

    def reset(self, seed: int | None = None) -> tuple[str, dict]:
        rng = random.Random(seed)
        while True:
            self.numbers = rng.sample(POOL, self.size)
            self.solution, value = self._random_expression(rng)
            if value.denominator == 1 and 1 < value <= 1000 and value not in self.numbers:
                self.target = int(value)
                break
        return self._observation(), {}

    def _random_expression(self, rng: random.Random) -> tuple[str, Fraction]:
        """Combine some of the numbers left to right with random operations: a target known to be reachable."""
        chosen = rng.sample(self.numbers, rng.randint(2, self.size))
        text, value = str(chosen[0]), Fraction(chosen[0])
        for n in chosen[1:]:
            op = rng.choice(list(OPS))
            if op == "/" and value % n:
                op = "+"
            text, value = f"({text} {op} {n})", OPS[op](value, Fraction(n))
        return text, value

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        expression = first_move(action, parse_expression)
        if expression is None:
            reason = "one expression of the numbers with + - * / and parentheses, in brackets"
            return self._observation(), 0.0, False, False, {"invalid_action": True, "reason": reason}
        allowed = not (numbers_used(expression) - Counter(self.numbers))
        value = evaluate(expression) if allowed else None  # at most ``size`` small numbers: cheap
        correct = allowed and value == self.target
        return ("Correct." if correct else "Wrong."), float(correct), True, False, {
            "correct": correct, "value": None if value is None else str(value), "numbers_allowed": allowed}

    def legal_actions(self) -> list[str]:
        return [bracket(self.solution)]

    def _observation(self) -> str:
        return (f"Countdown. Numbers: {' '.join(map(str, self.numbers))}. Target: {self.target}.\n"
                f"Use each number at most once with + - * / and parentheses. Answer like [(1 + 2) * 3]:")
