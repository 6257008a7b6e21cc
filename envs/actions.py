"""The action format shared by every tidal environment: the move inside square brackets.

``I think [bet] is best`` plays ``bet``. Text around the brackets is ignored, and so is case; when a text
holds several bracketed parts, the first one that reads as a move of the game counts. Each game documents
what goes inside the brackets (``[5]``, ``[bid 3 4]``, ``[offer 2 wood for 1 gold]``, ``[answer 42]``).
"""

from __future__ import annotations

import re
from typing import Callable, TypeVar

T = TypeVar("T")
BRACKETED = re.compile(r"\[([^\[\]]*)\]")


def first_move(text: str, read: Callable[[str], T | None]) -> T | None:
    """The first bracketed part of ``text`` that ``read`` accepts (given stripped, lower-case, spaces
    collapsed), or None when there is none."""
    for inside in BRACKETED.findall(text):
        move = read(" ".join(inside.lower().split()))
        if move is not None:
            return move
    return None


def bracket(move: str) -> str:
    return f"[{move}]"
