"""Countdown: reach a target with + - * / and given numbers, checked exactly.

The agent gets ``size`` numbers (from 1-10, 25, 50, 75, 100) and a target that some of them reach. It
answers with one expression in brackets, e.g. ``[(25 - 5) * 4]``, using each given number at most once (as
often as it is given). The verifier parses the expression (numbers, + - * /, parentheses: nothing else is
evaluated) and computes it in exact fractions: reward 1 if it equals the target, else 0, and the episode
ends. An expression that cannot be read is invalid; one that uses other numbers is a wrong answer.
"""

from __future__ import annotations

import ast
import operator
import random
from collections import Counter
from fractions import Fraction

from envs.actions import bracket, first_move

POOL = (*range(1, 11), 25, 50, 75, 100)
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
SYMBOLS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


def parse_expression(text: str) -> ast.expr | None:
    """The expression's syntax tree if it is only whole numbers, + - * / and parentheses; else None."""
    if not text or set(text) - set("0123456789+-*/() "):
        return None
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if not isinstance(node, (ast.BinOp, ast.Constant, *OPS)) or (
                isinstance(node, ast.Constant) and not isinstance(node.value, int)):
            return None
    return tree


def evaluate(tree: ast.expr) -> Fraction | None:
    """Exact value of a parsed expression; None on division by zero."""
    if isinstance(tree, ast.Constant):
        return Fraction(tree.value)
    left, right = evaluate(tree.left), evaluate(tree.right)
    if left is None or right is None or (isinstance(tree.op, ast.Div) and right == 0):
        return None
    return OPS[type(tree.op)](left, right)


def numbers_used(tree: ast.expr) -> Counter:
    return Counter(node.value for node in ast.walk(tree) if isinstance(node, ast.Constant))


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
            if op is ast.Div and value % n:
                op = ast.Add
            text, value = f"({text} {SYMBOLS[op]} {n})", OPS[op](value, Fraction(n))
        return text, value

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        tree = first_move(action, parse_expression)
        if tree is None:
            reason = "one expression of the numbers with + - * / and parentheses, in brackets"
            return self._observation(), 0.0, False, False, {"invalid_action": True, "reason": reason}
        value = evaluate(tree)
        allowed = not (numbers_used(tree) - Counter(self.numbers))
        correct = allowed and value == self.target
        return ("Correct." if correct else "Wrong."), float(correct), True, False, {
            "correct": correct, "value": None if value is None else str(value), "numbers_allowed": allowed}

    def legal_actions(self) -> list[str]:
        return [bracket(self.solution)]

    def _observation(self) -> str:
        return (f"Countdown. Numbers: {' '.join(map(str, self.numbers))}. Target: {self.target}.\n"
                f"Use each number at most once with + - * / and parentheses. Answer like [(1 + 2) * 3]:")
