"""The action format shared by every tidal environment: the move inside square brackets.

``I think [bet] is best`` plays ``bet``. Text around the brackets is ignored, and so is case; when a text
holds several bracketed parts, the first one that reads as a move of the game counts. Each game documents
what goes inside the brackets (``[5]``, ``[bid 3 4]``, ``[offer 2 wood for 1 gold]``, ``[answer 42]``).
The env actor first reads the policy's completion through the run's answer form (``envs.answers``: the last
bracketed part, a ``\\boxed{}``, what follows ``</think>``), which hands the game bracketed text in this format.

A model may write anything, so reading a move never raises and takes time linear in the text: a number is
ASCII digits only, at most ``MAX_DIGITS`` of them (``read_int``); ``--5``, ``²``, ``٣`` or a thousand digits
name no number, and the move is invalid (or, where a game says so, a wrong answer).
"""

from __future__ import annotations

import re
from typing import Callable, TypeVar

T = TypeVar("T")
BRACKETED = re.compile(r"\[([^\[\]]*)\]")
MAX_DIGITS = 9  # the longest number a move may hold (a game with larger ones says so); int() of 5,000 digits raises


def first_move(text: str, read: Callable[[str], T | None], *, keep_case: bool = False) -> T | None:
    """The first bracketed part of ``text`` that ``read`` accepts (given stripped, lower-case unless
    ``keep_case``, spaces collapsed), or None when there is none. ``keep_case`` is for a move that is a message
    shown to another player (``envs.secret_keeper``); the game still reads it without regard to case."""
    for found in BRACKETED.finditer(text):
        inside = found.group(1)
        move = read(" ".join((inside if keep_case else inside.lower()).split()))
        if move is not None:
            return move
    return None


def bracket(move: str) -> str:
    return f"[{move}]"


def read_int(text: str, *, signed: bool = False, max_digits: int = MAX_DIGITS) -> int | None:
    """``text`` as a whole number: 1 to ``max_digits`` ASCII digits, after one ``-`` when ``signed``; None for
    anything else (``--5``, ``+5``, unicode digits such as ``²`` or ``٣``, too many digits)."""
    digits = text[1:] if signed and text.startswith("-") else text
    if not (0 < len(digits) <= max_digits and digits.isascii() and digits.isdigit()):
        return None
    return int(text)
