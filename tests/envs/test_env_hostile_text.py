"""Text a model can write never makes an environment raise: each finding of the outside review, reproduced.

Unreadable or absurd moves are invalid moves (``StepResult(invalid=True)``, penalised by ``envs.invalid``), or
a wrong answer where that is the env's contract (Countdown scores a readable expression); nothing raises, and
parsing takes time linear in the text.
"""

import time

import pytest
import trio

import envs
from envs.actions import MAX_DIGITS, read_int
from envs.countdown import Countdown, evaluate, parse_expression
from envs.registry import ENVIRONMENTS

# superscript, Arabic-Indic, fullwidth, mathematical bold, circled, N'Ko: int() reads some, isdigit() passes some
UNICODE_DIGITS = ["²", "٣", "３", "𝟓", "①", "߃"]


def step(game, text):
    result = game.step(text)
    return result if isinstance(result, envs.StepResult) else trio.run(lambda: result)


def fresh(name, **kwargs):
    game = envs.make(name, max_retries=5, **kwargs)
    game.reset(0)
    return game


def test_read_int_takes_ascii_digits_only_and_a_handful_of_them():
    assert read_int("42") == 42 and read_int("-7", signed=True) == -7 and read_int("007") == 7
    assert read_int("9" * MAX_DIGITS) == int("9" * MAX_DIGITS)
    for text in ["", "-", "--5", "-5", "+5", "5 ", "1e3", "9" * (MAX_DIGITS + 1), "9" * 5000, *UNICODE_DIGITS]:
        assert read_int(text) is None, text
    assert read_int("--5", signed=True) is None and read_int("-" + "9" * (MAX_DIGITS + 1), signed=True) is None


@pytest.mark.parametrize("number", UNICODE_DIGITS + ["9" * 5000, "9" * (MAX_DIGITS + 1), "0" * MAX_DIGITS + "1"])
def test_liars_dice_bids_with_unicode_or_over_long_numbers_are_invalid(number):
    for move in [f"[bid {number} 3]", f"[bid 1 {number}]"]:
        game = fresh("liars_dice")
        result = step(game, move)
        assert result.invalid and not result.terminated and game.bid is None, move
    assert not step(fresh("liars_dice"), "[bid 1 3]").invalid  # the honest bid still reads


@pytest.mark.parametrize("move", ["[--5]", "[-]", "[5-]", *(f"[{d}]" for d in UNICODE_DIGITS), "[" + "1" * 5000 + "]",
                                  "[0000000000005]"])
def test_guess_number_unreadable_guesses_are_invalid(move):
    game = fresh("guess_number")
    result = step(game, move)
    assert result.invalid and not result.terminated and game.env.feedback == []


def test_guess_number_reads_bounds_wider_than_the_handful_of_digits():
    game = fresh("guess_number", low=-10**12, high=10**12)
    assert not step(game, f"[{-10**12}]").invalid and step(game, "[--5]").invalid


@pytest.mark.parametrize("quantity", ["9" * 5000, "99999999999999", "100", *UNICODE_DIGITS])
def test_negotiation_offers_of_huge_or_unreadable_quantities_are_invalid(quantity):
    game = fresh("negotiation")
    for move in [f"[offer 1 wood for {quantity} gold]", f"[offer {quantity} wood for 1 gold]"]:
        result = step(game, move)
        assert result.invalid and game.offer is None and game.turns == 0, move


def test_negotiation_asks_at_most_what_the_table_holds():
    game = fresh("negotiation")
    pool = game.inventory[0]["gold"] + game.inventory[1]["gold"]
    assert step(game, f"[offer 1 wood for {pool + 1} gold]").invalid
    assert step(game, f"[offer 1 wood for {pool} gold, 1 gold]").invalid  # summed over the bundle
    assert not step(game, f"[offer 1 wood for {pool} gold]").invalid


@pytest.mark.parametrize("terms", [2_000, 100_000])
def test_countdown_a_very_long_sum_is_a_wrong_answer_not_a_recursion_error(terms):
    game = fresh("countdown")
    result = step(game, "[" + " + ".join(["1"] * terms) + "]")
    assert not result.invalid and result.terminated and result.rewards == [0.0]
    assert result.info["correct"] is False and result.info["numbers_allowed"] is False


def test_countdown_deep_parentheses_are_read_without_recursion():
    task = Countdown()
    task.reset(seed=0)
    task.numbers, task.target = [25, 5, 4, 3], 80
    deep = 100_000
    assert task.step("[" + "(" * deep + "(25 - 5) * 4" + ")" * deep + "]")[1] == 1.0
    assert task.step("[" + "(" * deep + "25" + ")" * (deep - 1) + "]")[4]["invalid_action"]  # unbalanced
    products = " * ".join(["99"] * 3000)  # readable, other numbers: wrong, and not computed at all
    assert task.step(f"[{products}]")[4] == {"correct": False, "value": None, "numbers_allowed": False}


@pytest.mark.parametrize("text", ["9" * 5000, "9" * (MAX_DIGITS + 1), "٢٥ * 4", "(25 - 5) * 4)", "((25 - 5) * 4",
                                  "25 5", "(25)(5)", "25 -", "* 25", "()"])
def test_countdown_unreadable_expressions_are_invalid(text):
    assert parse_expression(text) is None
    task = Countdown()
    task.reset(seed=0)
    assert task.step(f"[{text}]")[4]["invalid_action"]


def test_countdown_evaluates_with_precedence_and_left_associativity():
    assert evaluate(parse_expression("2 + 3 * 4")) == 14 and evaluate(parse_expression("(2 + 3) * 4")) == 20
    assert evaluate(parse_expression("100 - 10 - 5")) == 85 and evaluate(parse_expression("100 / 10 / 5")) == 2
    assert evaluate(parse_expression("7 / (3 - 3)")) is None


@pytest.mark.parametrize("move", ["[answer " + "9" * 5000 + "]", "[answer --42]", "[answer ٤٢]", "[lookup ａpple]"])
def test_tool_latency_unreadable_answers_are_invalid(move):
    game = fresh("tool_latency", latency_median_s=0.0)
    result = step(game, move)
    assert result.invalid and not result.terminated


def test_tool_latency_still_reads_answers_and_lookups():
    game = fresh("tool_latency", latency_median_s=0.0)
    assert not step(game, "[LOOKUP apple]").invalid
    result = step(game, f"[answer {game.answer}]")
    assert result.terminated and result.rewards == [1.0]


HOSTILE_SHAPES = ["[" + "1+" * 100_000 + "1]", "[" + "(" * 200_000 + "]", "[" * 200_000, "[a" * 100_000,
                  "[bid " + "9" * 200_000 + " 3]", "[offer " + "1 wood " * 30_000 + "for 1 gold]",
                  "[answer " + "9" * 200_000 + "]", "[lookup " + " " * 200_000 + "x", "x" * 200_000]


@pytest.mark.parametrize("name", sorted(ENVIRONMENTS))
def test_every_env_reads_200k_hostile_characters_quickly(name):
    """Linear parsing: each of these takes milliseconds; anything quadratic in 200,000 characters takes minutes."""
    kwargs = {"latency_median_s": 0.0} if name == "tool_latency" else {}
    for text in HOSTILE_SHAPES:
        game = fresh(name, **kwargs)
        started = time.perf_counter()
        result = step(game, text)
        assert time.perf_counter() - started < 2.0, (name, text[:30])
        assert isinstance(result, envs.StepResult)
