"""Proposals that show their work: the proposer writes an expression of dealt numbers and the env computes the
target (``envs.propose_solve``'s ``witness`` option).

Absolute Zero's proposer writes a program and its input, and an executor computes the output the solver must
find: the proposer never has to compute anything itself, so its proposals are valid as often as it can write
the form. The Countdown form of it: the env deals the numbers, the proposer writes an expression of some of them
(``[4 * 5]``), and its value is the solver's target. Absolute Zero also draws each proposal's task type itself
(deduction, abduction, induction) rather than leaving it to the proposer; with ``typed`` witnesses the env draws
the form the expression must take (``FORMS``), so the mix of what the tasks ask is the env's and what the
proposer chooses is which numbers, and how, within it.
"""

from __future__ import annotations

import functools
from itertools import permutations

from envs.countdown import evaluate, parse_expression

# one of the numbers alone, one +, one -, one *, or anything else (a division, several operations): the kinds of
# task ``envs.propose_solve.task_kind`` names
FORMS = ("copy", "a+b", "a-b", "a*b", "other")
OPERATIONS = FORMS[1:]  # the forms with at least one operation: a free witness's
# the forms a typed witness draws from when ``forms`` is not given (the recipe's config adds ``copy``). Not ``other``:
# the tiny model's warmed-up proposer wrote no valid one (0 of 51), so asking for it only cost a forfeit
DRAWN = ("a+b", "a-b", "a*b")
SHOWN = {"copy": "is one of them alone, like [9]", "a+b": "adds two of them, like [4 + 9]",
         "a-b": "subtracts one from another, like [9 - 4]",
         "a*b": "multiplies two of them, like [4 * 5]",
         "other": "has two operations or a division, like [3 * 4 + 5]",
         None: "has at least one operation, like [3 * 4 + 5]"}


def form_of(expression) -> str:
    """The form of a parsed expression (``FORMS``): ``copy`` for a number alone, ``a+b`` for one addition, and so
    on; ``other`` otherwise."""
    ops = [item for item in expression if isinstance(item, str)]
    if not ops:
        return "copy"
    return f"a{ops[0]}b" if len(ops) == 1 and ops[0] != "/" else "other"


def witnesses(numbers: tuple[int, ...], form: str, max_target: int) -> list[str]:
    """Expressions of ``form`` from some of ``numbers`` (each at most once) whose value is a whole number from 1
    to ``max_target``: one of them alone (``copy``), a pair of them with one operation, or, for ``other``, a
    division of two of them or two operations on three. Sorted, so that a seeded draw among them is the same
    everywhere."""
    if form not in FORMS:
        raise ValueError(f"form must be one of {', '.join(FORMS)}, not {form!r}")
    return list(_witnesses(tuple(sorted(numbers)), form, max_target))


@functools.lru_cache(maxsize=8192)
def _witnesses(numbers: tuple[int, ...], form: str, max_target: int) -> tuple[str, ...]:
    texts = set()
    if form == "other":
        for a, b in permutations(numbers, 2):
            texts.add(f"{a} / {b}")
        for a, b, c in permutations(numbers, 3):
            for x in "+-*/":
                for y in "+-*/":
                    texts.update((f"{a} {x} {b} {y} {c}", f"({a} {x} {b}) {y} {c}", f"{a} {x} ({b} {y} {c})"))
    elif form == "copy":
        texts.update(str(n) for n in numbers)
    else:
        texts.update(f"{a} {form[1]} {b}" for a, b in permutations(numbers, 2))
    values = {text: evaluate(parse_expression(text)) for text in texts}  # each text has its form by construction
    return tuple(sorted(text for text, value in values.items()
                        if value is not None and value.denominator == 1 and 1 <= value <= max_target))
