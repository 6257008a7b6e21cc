"""Answer forms: where in a completion the policy's move is, one choice for every env (``env.args.answer``).

tidal's games read a move as the first bracketed part that reads as one (``envs.actions.first_move``); a model
that reasons first writes its move elsewhere: last, in ``\\boxed{...}``, or after ``</think>``. A form turns a
completion into the text the game reads (``read_answer``), or None when it finds no answer at all:

- ``first_bracket`` (the default): the completion as written; the game reads its first bracketed part that is
  a move. No bracketed part at all: no answer.
- ``last_bracket``: the last bracketed part that is a move. The bracketed parts go to the game in reverse order,
  so the game's own ``first_move`` picks the last one that reads.
- ``boxed``: the last ``\\boxed{...}`` whose braces close (nested braces count: ``\\boxed{\\frac{1}{2}}``; of
  nested boxes, the inner one, which starts last, as GEM reads them). ``\\boxed{5}`` is read as ``[5]``; a box
  that holds brackets is read as the game reads any text, so ``\\boxed{[5]}`` plays 5 too.
- ``think_first_bracket``, ``think_last_bracket``, ``think_boxed``: the same, in the text after the last
  ``</think>`` only: the reasoning never counts, and a completion without ``</think>`` has no answer.

A completion without an answer is unreadable: the env actor plays it as an invalid move and counts it apart from
one the game refuses (an answer found but not a legal move, ``[10]`` in TicTacToe); see ``actors.env.episode``.

GEM environments (``gem:<id>``) read ``\\boxed{}`` themselves: they take the boxed forms only, and get the box the
form found as ``\\boxed{...}`` (GEM's games read the last box of what they get). They cannot read brackets, so the
bracket forms are refused for them (``answer_problem``).

A model may write anything: every form takes time linear in the text (one pass over its brackets or braces,
100,000 unmatched braces included) and never raises on any text.
"""

from __future__ import annotations

import re

from envs.actions import BRACKETED
from envs.registry import GEM_PREFIX

THINK_END = "</think>"
THINK = "think_"  # the prefix of a form read after the reasoning only
BASE_FORMS = ("first_bracket", "last_bracket", "boxed")
FORMS = BASE_FORMS + tuple(THINK + form for form in BASE_FORMS)
BOX_FORMS = ("boxed", THINK + "boxed")  # what an env that reads boxes itself (GEM) can take
DEFAULT = "first_bracket"
BOX_PARTS = re.compile(r"\\boxed\{|[{}]")  # a box's start, or any brace


def default_stops(form: str) -> list[str]:
    """The stop strings a completion read in ``form`` may end at (``sampling.stop`` null): the first ``]`` for
    ``first_bracket`` (nothing after it is read); none for the others, whose answer comes last."""
    return ["]"] if form == "first_bracket" else []


def reads_boxes(env_name: str) -> bool:
    """Whether ``env_name`` reads its moves from ``\\boxed{}`` itself (a GEM environment) instead of brackets."""
    return env_name.startswith(GEM_PREFIX)


def answer_problem(form: str, env_name: str) -> str | None:
    """Why ``form`` cannot read ``env_name``'s moves (naming ``env.args.answer``), or None when it can."""
    if form not in FORMS:
        return f"answer {form!r} is not an answer form: env.args.answer is one of {', '.join(FORMS)}"
    if reads_boxes(env_name) and form not in BOX_FORMS:
        return (f"answer {form!r} cannot be read by {env_name}: a GEM environment reads its moves from \\boxed{{}} "
                f"only, so env.args.answer must be one of {', '.join(BOX_FORMS)}")
    return None


def read_answer(text: str, form: str, *, boxes: bool = False) -> str | None:
    """The text the game reads for a completion ``text`` in the answer form ``form``, or None when the form finds
    no answer in it. ``boxes``: the game reads ``\\boxed{}`` itself (``reads_boxes``), so a box goes to it as
    ``\\boxed{...}``, not as a bracketed move."""
    if form.startswith(THINK):
        end = text.rfind(THINK_END)
        if end < 0:
            return None
        text, form = text[end + len(THINK_END):], form[len(THINK):]
    if form == "boxed":
        inside = last_box(text)
        if inside is None:
            return None
        if boxes:
            return "\\boxed{" + inside + "}"
        return inside if "[" in inside or "]" in inside else "[" + inside + "]"
    if form == "first_bracket":
        return text if BRACKETED.search(text) else None
    if form == "last_bracket":
        parts = [found.group() for found in BRACKETED.finditer(text)]
        return " ".join(reversed(parts)) if parts else None
    raise ValueError(f"answer {form!r} is not an answer form: env.args.answer is one of {', '.join(FORMS)}")


def last_box(text: str) -> str | None:
    """What is inside the ``\\boxed{...}`` of ``text`` that starts last among those whose braces close, or None.

    One pass over the braces: a stack holds, for each brace still open, where its box's content starts (-1 for a
    brace that opens no box). A ``}`` with nothing open is ignored; a box still open at the end is no answer."""
    open_braces: list[int] = []
    start, end = -1, -1
    for part in BOX_PARTS.finditer(text):
        if part.group() == "}":
            if open_braces:
                opened = open_braces.pop()
                if opened > start:
                    start, end = opened, part.start()
        else:
            open_braces.append(part.end() if len(part.group()) > 1 else -1)
    return text[start:end] if start >= 0 else None


def unreadable_reason(form: str) -> str:
    """What a completion without an answer lacks, for the note of a retry (``envs.invalid``)."""
    where = "as \\boxed{...}" if form.endswith("boxed") else "in square brackets"
    after = f" after {THINK_END}" if form.startswith(THINK) else ""
    return f"no answer found: write the move {where}{after}"
