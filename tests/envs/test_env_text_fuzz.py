"""Property test: generated text thrown at every registered environment, at every seat, for several steps.

Whatever a model writes (arbitrary unicode, bracketed junk, huge and unicode numbers, deep nesting, very long
strings), an environment answers with a well-formed ``StepResult`` and never raises. Where the test knows the
answer it checks it too: a legal move is valid; a legal move with its number made unreadable (unicode digits,
``--``, too many digits) or a unicode digit glued to its word, and any text without a ``[``, is invalid and
changes nothing. GEM environments (``gem:<id>``, when the ``gem`` package is installed) follow GEM's own
contract for bad moves (a penalty, no invalid flag), so for them only the first two properties are checked.
"""

from __future__ import annotations

import math
import re
from importlib.util import find_spec

import pytest
import trio
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import envs
from envs.registry import ENVIRONMENTS

CASES = [(name, {"latency_median_s": 0.0} if name == "tool_latency" else {}) for name in sorted(ENVIRONMENTS)]
CASES.append(("liars_dice", {"players": 6, "dice": 1}))
if find_spec("gem") is not None:  # the configured default (configs/env/gem.yaml) and the one its comment names
    CASES += [("gem:game:GuessTheNumber-v0-easy", {}), ("gem:game:Mastermind-v0-easy", {})]

FUZZ = settings(max_examples=50, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

WORDS = ["bid", "liar", "offer", "for", "and", ",", "accept", "deny", "wood", "stone", "gold", "check", "bet", "call",
         "fold", "lookup", "answer", "apple", "(", ")", "+", "-", "*", "/", "--", "\\boxed{", "}", "[", "]", "0"]
NUMBERS = st.one_of(st.integers(-10**30, 10**30).map(str),
                    st.integers(10, 6000).map(lambda n: "9" * n),
                    st.text(st.characters(categories=["Nd", "No"]), min_size=1, max_size=4))
BRACKETED = st.lists(st.one_of(st.sampled_from(WORDS), NUMBERS, st.text(max_size=6)), max_size=8).map(
    lambda words: "[" + " ".join(words) + "]")
REPEATED = st.builds(lambda unit, times, close: "[" + unit * times + ("]" if close else ""),
                     st.sampled_from(["(", "1+", "1 + ", "[", "\\boxed{", "bid 9 ", "1 wood ", "9", " ", "-", "é"]),
                     st.integers(1, 30_000), st.booleans())
NESTED = st.integers(1, 20_000).map(lambda depth: "[" + "(" * depth + "25" + ")" * depth + "]")
TEXT = st.one_of(st.text(max_size=200), BRACKETED, REPEATED, NESTED)
AROUND = st.text(st.characters(exclude_characters="[]"), max_size=20)  # text beside a move, with no move in it
# a move: ("text", s) as it is, or ("legal" | "corrupt", which legal move, which corruption, text around it)
MOVES = st.one_of(st.tuples(st.just("text"), TEXT),
                  st.tuples(st.sampled_from(["legal", "corrupt"]), st.integers(0, 10**6), st.integers(0, 10**6),
                            AROUND, AROUND))

# played once from each seat (``example``), so every seat gets hostile moves whatever the generated ones do
AT_EVERY_SEAT = [("text", "[bid ² 3] [--5] [offer 1 wood for " + "9" * 5000 + " gold]"), ("corrupt", 0, 1, "", ""),
                 ("text", "[" + " + ".join(["1"] * 20_000) + "]"), ("corrupt", 0, 0, "I say ", "."),
                 ("text", "[" * 10_000 + "(" * 10_000), ("legal", 0, 0, "", "")]

UNICODE_DIGIT_ZEROS = [0x660, 0x966, 0xFF10, 0x1D7CE, 0x7C0]  # Arabic-Indic, Devanagari, fullwidth, math bold, N'Ko
DIGITS = re.compile(r"[0-9]+")


def corrupt(move: str, how: int) -> str:
    """``move`` made unreadable: its first number in unicode digits, doubly negated or too long, or (a move
    with no number) a unicode digit glued to its last word."""
    found = DIGITS.search(move)
    if found is None:
        return move[:-1] + "²]"
    digits, kind = found.group(), how % 4
    if kind == 0:
        zero = UNICODE_DIGIT_ZEROS[how // 4 % len(UNICODE_DIGIT_ZEROS)]
        bad = "".join(chr(zero + int(d)) for d in digits)
    elif kind == 1:
        bad = "--" + digits
    elif kind == 2:
        bad = digits.rjust(10, "0")
    else:
        bad = digits + "9" * (10 + how // 4 % 5000)
    return move[:found.start()] + bad + move[found.end():]


def step(game, text: str) -> envs.StepResult:
    result = game.step(text)
    return result if isinstance(result, envs.StepResult) else trio.run(lambda: result)


def check_result(result, players: int) -> None:
    assert isinstance(result, envs.StepResult)
    assert len(result.rewards) == players and all(isinstance(r, float) and math.isfinite(r) for r in result.rewards)
    assert all(isinstance(flag, bool) for flag in (result.terminated, result.truncated, result.invalid))
    assert isinstance(result.info, dict)


@pytest.mark.parametrize("name,kwargs", CASES, ids=[f"{n}{kw.get('players', '')}" for n, kw in CASES])
def test_generated_text_never_makes_an_env_raise(name, kwargs):
    game = envs.make(name, max_retries=20, **kwargs)  # invalid moves cost a retry, so the fuzzing goes on
    ours, players = not name.startswith("gem:"), game.num_players
    seats_fuzzed: set[int] = set()

    def play(seed, start, moves):
        game.reset(seed)
        for _ in range(start):  # legal moves until seat ``start`` is to move (the fuzzing then goes round)
            if step(game, game.legal_actions()[0]).terminated:
                return
        for move in moves:
            mover = game.current_player
            assert 0 <= mover < players and all(isinstance(game.observation(s), str) for s in range(players))
            legal = game.legal_actions()
            assert legal and all(isinstance(action, str) for action in legal)
            if move[0] == "text":
                text, expect_invalid = move[1], True if "[" not in move[1] else None
            else:
                numbered = [action for action in legal if DIGITS.search(action)] if move[2] % 2 else []
                chosen = (numbered or legal)[move[1] % len(numbered or legal)]  # often one with a number
                text = move[3] + (chosen if move[0] == "legal" else corrupt(chosen, move[2])) + move[4]
                expect_invalid = move[0] == "corrupt"
            before = [game.game.observation(s) for s in range(players)] if ours else None
            result = step(game, text)
            seats_fuzzed.add(mover)
            check_result(result, players)
            if ours and expect_invalid is not None:
                assert result.invalid == expect_invalid, (text[:120], result)
            if ours and result.invalid and not result.terminated:  # changed nothing
                assert game.current_player == mover and [game.game.observation(s) for s in range(players)] == before
            if result.terminated or result.truncated:
                return

    fuzzed = given(seed=st.integers(0, 2**31 - 1), start=st.integers(0, players - 1),
                   moves=st.lists(MOVES, min_size=1, max_size=8))(play)
    for seat in range(players):
        fuzzed = example(seed=seat, start=seat, moves=AT_EVERY_SEAT)(fuzzed)
    FUZZ(fuzzed)()
    assert seats_fuzzed == set(range(players))  # every seat got fuzzed moves


def test_corrupted_moves_really_are_unreadable_to_every_game():
    """The oracle above, checked once by hand: each corruption of one legal move of each game."""
    for name, kwargs in CASES:
        if name.startswith("gem:"):
            continue
        game = envs.make(name, max_retries=50, **kwargs)
        game.reset(1)
        for how in range(12):
            chosen = game.legal_actions()[-1]
            bad = corrupt(chosen, how)
            assert bad != chosen and step(game, bad).invalid, (name, bad[:60])


def test_pettingzoo_actions_outside_the_space_are_refused_and_masked_ones_are_invalid_moves():
    pytest.importorskip("pettingzoo")
    from envs.pettingzoo_adapter import aec_env

    env = aec_env("tictactoe", max_retries=1)
    env.reset(seed=0)
    for outside in (-1, 9, 10**30):
        with pytest.raises(ValueError, match=r"outside the action space, Discrete\(9\)"):
            env.step(outside)
    assert env.game.board == [None] * 9  # -1 no longer plays the last cell
    env.step(4)
    env.step(4)  # taken: masked out, an invalid move that costs a retry, not an error
    assert env.game.board[4] == 0 and env.agent_selection == "player_1" and env.rewards["player_1"] == -0.1
