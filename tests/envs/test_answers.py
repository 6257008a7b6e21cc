"""Answer forms (``envs.answers``): where the policy's move is in what it wrote, on ordinary, tricky and hostile text.

Each form turns a completion into the text the game reads, or None when it finds no answer. Hostile text
(100,000 unmatched braces, boxes that never close, ``</think>`` 100,000 times) reads in one pass: the tests count
the reader's steps by the size of the text, not by the clock.
"""

from __future__ import annotations

import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import envs
from envs.answers import BOX_FORMS, FORMS, answer_problem, last_box, read_answer, reads_boxes, unreadable_reason

GEM = "gem:game:GuessTheNumber-v0-easy"


def played(text: str, form: str, game: str = "tictactoe"):
    """The cell (1-9) TicTacToe plays for ``text`` read in ``form``; None for an invalid move or no answer."""
    answer = read_answer(text, form)
    if answer is None:
        return None
    board = envs.make(game)
    board.reset(0)
    result = board.step(answer)
    return None if result.invalid else board.game.board.index(0) + 1


@pytest.mark.parametrize("text, form, cell", [
    ("I play [5]", "first_bracket", 5),
    ("[10] is off the board, so [3], not [7]", "first_bracket", 3),  # the first one that is a move
    ("[3] at first, then [7], not [10]", "last_bracket", 7),  # the last one that is a move
    ("so the answer is \\boxed{5}", "boxed", 5),
    ("\\boxed{ 5 }", "boxed", 5),
    ("\\boxed{[5]}", "boxed", 5),  # a box that holds brackets: its bracketed move
    ("\\boxed{2} no, wait: \\boxed{8}", "boxed", 8),  # the last box
    ("\\boxed{8} and \\boxed{\\text{10}}", "boxed", None),  # the last box is the answer, not a legal move
    ("<think>[1] or [2]?</think> [5]", "think_first_bracket", 5),
    ("<think>[1] or [2]?</think> [5] then [6]", "think_last_bracket", 6),
    ("<think>\\boxed{1}</think> so \\boxed{9}", "think_boxed", 9),
    ("<think>\\boxed{1}</think> so \\boxed{9}", "boxed", 9),
])
def test_each_form_finds_its_move(text, form, cell):
    assert played(text, form) == cell


@pytest.mark.parametrize("form, text", [
    ("first_bracket", "I play five"), ("first_bracket", "\\boxed{5}"), ("first_bracket", "[5"),
    ("last_bracket", "5]"), ("boxed", "I play [5]"), ("boxed", "\\boxed{5"), ("boxed", "\\boxed5}"),
    ("boxed", "\\boxed {5}"),  # the box's brace follows \boxed at once
    ("think_first_bracket", "<think>[5]"),  # no </think>: nothing is readable, even a move in the reasoning
    ("think_first_bracket", "[5] <think>"), ("think_last_bracket", "[5]</think>"),  # nothing after the reasoning
    ("think_boxed", "\\boxed{5}"), ("think_boxed", "<think>\\boxed{5}</think> I play [5]"),
    ("think_boxed", "</THINK> \\boxed{5}"),  # the closing tag is matched as models write it, in lower case
])
def test_a_completion_without_an_answer_in_the_form_reads_as_none(form, text):
    assert read_answer(text, form) is None


def test_an_answer_that_is_no_move_is_read_not_none():
    """Unreadable (None) and illegal are apart: a form that finds an answer hands it over, the game refuses it."""
    assert read_answer("[ten]", "first_bracket") == "[ten]" and played("[ten]", "first_bracket") is None
    assert read_answer("\\boxed{}", "boxed") == "[]" and read_answer("\\boxed{ten}", "boxed") == "[ten]"
    assert read_answer("[]", "last_bracket") == "[]"


def test_first_bracket_hands_the_completion_over_as_written():
    """Today's reading, unchanged: the game's ``first_move`` reads the completion itself."""
    for text in ["I play [5]", "[x] [5] \\boxed{3}", "<think>[1]</think>[2]"]:
        assert read_answer(text, "first_bracket") == text


def test_last_bracket_hands_the_bracketed_parts_over_last_first():
    assert read_answer("a [1] b [2] c [ 3 ]", "last_bracket") == "[ 3 ] [2] [1]"
    assert read_answer("[[5]]", "last_bracket") == "[5]"  # only brackets with no bracket inside are parts


def test_boxes_nest_and_the_box_that_starts_last_counts():
    assert last_box("\\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert last_box("\\boxed{a} \\boxed{b{c}d}") == "b{c}d"
    assert last_box("\\boxed{x \\boxed{5} y}") == "5"  # nested boxes: the inner one, as GEM reads them
    assert last_box("\\boxed{1} \\boxed{2") == "1"  # a box cut off (the token budget) is no answer; the one before is
    assert last_box("}}} \\boxed{7}}}") == "7" and last_box("{{{ \\boxed{7}") == "7"  # stray braces around it
    assert last_box("\\boxed{ {5 }") is None  # the inner brace takes the only close: the box stays open
    assert last_box("\\boxed{}") == "" and last_box("boxed{5}") is None and last_box("") is None


def test_the_text_after_the_last_think_end_counts():
    text = "<think>[1]</think> [2] <think>again</think> [3]"
    assert read_answer(text, "think_first_bracket") == " [3]"
    assert read_answer("</think></think>", "think_last_bracket") is None
    assert read_answer("<think>\\boxed{1}</think>\\boxed{2}</think>", "think_boxed") is None  # nothing after the last
    assert read_answer("</think>\\boxed{1}</think>\\boxed{2}", "think_boxed") == "[2]"


def test_a_gem_environment_gets_the_box_it_reads_itself():
    """With ``boxes`` the answer goes on as ``\\boxed{...}``: the last box only, so GEM's own reading (the last box
    matching its game's pattern) reads the same answer as tidal's games would."""
    assert read_answer("\\boxed{3} no, \\boxed{4}", "boxed", boxes=True) == "\\boxed{4}"
    assert read_answer("<think>\\boxed{1}</think>\\boxed{\\frac{1}{2}}", "think_boxed", boxes=True) == \
        "\\boxed{\\frac{1}{2}}"
    assert read_answer("I guess [4]", "boxed", boxes=True) is None
    assert reads_boxes(GEM) and not reads_boxes("tictactoe")


def test_gem_reads_the_handed_box_with_its_own_parser():
    pytest.importorskip("gem")
    from gem.utils.parsing import extract_last_boxed_answer

    for text in ["\\boxed{3} no, \\boxed{4}", "\\boxed{x \\boxed{4}}", "\\boxed{{4}}"]:
        assert extract_last_boxed_answer(read_answer(text, "boxed", boxes=True)) == last_box(text)
    game = envs.make(GEM)
    game.reset(1)
    guess = game.step(read_answer("<think>maybe \\boxed{1}</think> \\boxed{2} or rather \\boxed{3}", "think_boxed",
                                  boxes=True))
    assert "guessed 3" in game.observation(0) or "Congratulations" in game.observation(0), guess


def test_forms_an_env_cannot_read_are_refused_naming_the_key():
    assert all(answer_problem(form, "tictactoe") is None for form in FORMS)
    assert "env.args.answer is one of first_bracket" in answer_problem("boxd", "tictactoe")
    for form in FORMS:
        problem = answer_problem(form, GEM)
        assert (problem is None) == (form in BOX_FORMS), form
        assert problem is None or ("env.args.answer must be one of boxed, think_boxed" in problem)
    with pytest.raises(ValueError, match="env.args.answer is one of"):
        read_answer("[5]", "boxd")


def test_the_retry_note_says_what_was_missing():
    assert unreadable_reason("boxed") == "no answer found: write the move as \\boxed{...}"
    assert unreadable_reason("think_last_bracket") == "no answer found: write the move in square brackets after </think>"


# -- hostile text: every form in one pass ------------------------------------------------------------------

N = 100_000
HOSTILE = {
    "unmatched opening braces": "\\boxed{" + "{" * N,
    "unmatched closing braces": "}" * N + "\\boxed{5}" + "}" * N,
    "boxes that never close": "\\boxed{" * N,
    "boxes nested deep": "\\boxed{" * N + "5" + "}" * N,
    "many boxes": "\\boxed{1}" * N + "\\boxed{5}",
    "opening brackets": "[" * N + "[5]",
    "brackets never closed": "[5" * N,
    "many brackets": "[x]" * N + "[5]",
    "think ends": "</think>" * N + "[5] \\boxed{5}",
    "think never ends": "<think>" * N + "[5] \\boxed{5}",
}
EXPECTED = {  # form -> reading, per case (None: no answer)
    "unmatched opening braces": {"boxed": None, "first_bracket": None},
    "unmatched closing braces": {"boxed": "[5]", "first_bracket": None},
    "boxes that never close": {"boxed": None, "last_bracket": None},
    "boxes nested deep": {"boxed": "[5]", "think_boxed": None},
    "many boxes": {"boxed": "[5]"},
    "opening brackets": {"first_bracket": "[" * N + "[5]", "last_bracket": "[5]"},
    "brackets never closed": {"first_bracket": None, "last_bracket": None},
    "many brackets": {"last_bracket": "[5] " + " ".join(["[x]"] * N)},
    "think ends": {"think_first_bracket": "[5] \\boxed{5}", "think_boxed": "[5]", "think_last_bracket": "[5]"},
    "think never ends": {"think_first_bracket": None, "boxed": "[5]", "last_bracket": "[5]"},
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_text_reads_right_in_every_form(case):
    text = HOSTILE[case]
    readings = {form: read_answer(text, form) for form in FORMS}  # none raises
    for form, expected in EXPECTED[case].items():
        assert readings[form] == expected, (case, form)


def steps_taken(function, *args) -> int:
    """How many lines of ``envs/answers.py`` run for ``function(*args)``: the reader's work, counted, not timed."""
    count = 0

    def trace(frame, event, arg):
        nonlocal count
        if frame.f_code.co_filename.endswith("answers.py"):
            if event == "line":
                count += 1
            return trace
        return None

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        function(*args)
    finally:
        sys.settrace(previous)
    return count


@pytest.mark.parametrize("unit", ["{", "}", "\\boxed{", "\\boxed{}", "[x]", "</think>", "{\\boxed{x}"])
@pytest.mark.parametrize("form", FORMS)
def test_reading_takes_steps_in_proportion_to_the_text(unit, form):
    """Four times the text takes about four times the steps (twice as many would be 16 for a quadratic reader)."""
    small, large = (steps_taken(read_answer, unit * n + "\\boxed{5} [5]", form) for n in (2_000, 8_000))
    assert large <= 4.5 * small + 50, (small, large)


# -- against a plain reading, on generated text ------------------------------------------------------------

def brute_last_box(text: str) -> str | None:
    """The box that starts last among those that close, by matching each box's braces from its start."""
    best = None
    start = text.find("\\boxed{")
    while start >= 0:
        depth, inside = 0, start + len("\\boxed{")
        for i in range(start + len("\\boxed"), len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                best = text[inside:i]
                break
        start = text.find("\\boxed{", start + 1)
    return best


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(st.lists(st.sampled_from(["\\boxed{", "{", "}", "5", "x", " ", "[", "]", "[5]", "</think>"]), max_size=40))
def test_the_last_box_is_the_one_brace_matching_finds(parts):
    text = "".join(parts)
    assert last_box(text) == brute_last_box(text)
    for form in FORMS:
        answer = read_answer(text, form)
        assert answer is None or isinstance(answer, str)
