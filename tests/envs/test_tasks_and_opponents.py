"""Single-agent tasks (Guess the Number, Countdown) and the fixed opponents (minimax, greedy, Kuhn equilibrium)."""

import itertools
from fractions import Fraction

import pytest

import envs
from envs.countdown import Countdown, evaluate, parse_expression
from envs.guess_number import GuessNumber
from envs.opponents import GreedyOpponent, KuhnEquilibrium, MinimaxOpponent, _negamax
from tests.factories import kuhn


def test_guess_number_feedback_then_success():
    task = GuessNumber(low=1, high=50, max_turns=7)
    task.reset(seed=9)
    low, high = 1, 50
    for turn in range(7):  # binary search on the feedback finds it within 6 guesses
        guess = (low + high) // 2
        observation, reward, terminated, truncated, _ = task.step(f"my guess: [{guess}]")
        if terminated:
            break
        assert reward == 0.0 and not truncated
        assert f"{guess}: the number is" in observation
        if "higher" in observation.rsplit(";", 1)[-1]:
            low = guess + 1
        else:
            high = guess - 1
    assert terminated and reward == 1.0 and guess == task.target


def test_guess_number_truncates_and_rejects_out_of_range():
    task = GuessNumber(low=1, high=10, max_turns=2)
    task.reset(seed=1)
    wrong = [n for n in range(1, 11) if n != task.target]
    assert task.step("[11]")[4]["invalid_action"] and task.step("eleven")[4]["invalid_action"]
    assert task.step(f"[{wrong[0]}]")[2:4] == (False, False)
    assert task.step(f"[{wrong[1]}]")[1:4] == (0.0, False, True)


def test_guess_number_seeds_are_reproducible():
    def target(seed):
        task = GuessNumber()
        task.reset(seed=seed)
        return task.target

    assert [target(s) for s in range(10)] == [target(s) for s in range(10)]
    assert len({target(s) for s in range(10)}) > 5


@pytest.mark.parametrize("seed", range(20))
def test_countdown_targets_are_reachable_and_the_solution_verifies(seed):
    task = Countdown()
    observation, _ = task.reset(seed=seed)
    assert f"Target: {task.target}" in observation
    assert task.step(f"The answer: {task.legal_actions()[0]}")[1:3] == (1.0, True)


def test_countdown_verifier_is_exact_and_strict():
    task = Countdown()
    task.reset(seed=0)
    task.numbers, task.target = [25, 5, 4, 3], 80
    assert task.step("[(25 - 5) * 4]")[1] == 1.0
    assert task.step("[25 * 4 - 5 * 3 - 5]")[4]["numbers_allowed"] is False  # 5 used twice
    assert task.step("[100 - 20]")[1] == 0.0  # numbers not given: a wrong answer, not an invalid one
    _, reward, terminated, _, info = task.step("[25 * 3 + 5]")
    assert (reward, terminated, info["correct"]) == (1.0, True, True)
    assert task.step("[25 / (5 - 5)]")[1] == 0.0  # division by zero: wrong
    for unreadable in ["[__import__('os')]", "[2 ** 10]", "[-3 + 4]", "[1.5 * 2]", "80", "[]"]:
        assert task.step(unreadable)[4].get("invalid_action"), unreadable
    assert evaluate(parse_expression("(7 - 1) / 4")) == Fraction(3, 2)


def test_minimax_never_loses_at_tictactoe():
    assert _negamax((None,) * 9, 0)[0] == 0  # the empty board is a draw with best play
    for seed in range(40):
        for minimax_seat in (0, 1):
            game = envs.make("tictactoe")
            game.reset(seed)
            seats = {minimax_seat: MinimaxOpponent(seed), 1 - minimax_seat: envs.make_opponent("random", seed=seed)}
            result = None
            while result is None or not result.terminated:
                result = game.step(seats[game.current_player].act(game))
            assert result.rewards[minimax_seat] >= 0


def test_minimax_takes_a_win_and_blocks_a_loss():
    game = envs.make("tictactoe")
    game.reset(0)
    for move in ["[1]", "[5]", "[2]"]:  # O to move: X threatens 3, only blocking there does not lose
        game.step(move)
    assert {MinimaxOpponent(seed).act(game) for seed in range(10)} == {"[3]"}
    game.step("[9]")  # O does not block; X to move wins at 3 at once
    assert {MinimaxOpponent(seed).act(game) for seed in range(10)} == {"[3]"}
    with pytest.raises(ValueError, match="tictactoe only"):
        MinimaxOpponent().act(envs.make("kuhn_poker"))



def test_greedy_takes_a_win_and_otherwise_plays_at_random():
    game = envs.make("tictactoe")
    game.reset(0)
    for move in ["[1]", "[5]", "[2]"]:  # O to move: no line of its own to complete, so any free cell
        game.step(move)
    assert {GreedyOpponent(seed).act(game) for seed in range(40)} == set(game.legal_actions())
    game.step("[9]")  # X to move completes its line at 3
    assert {GreedyOpponent(seed).act(game) for seed in range(10)} == {"[3]"}
    with pytest.raises(ValueError, match="tictactoe only"):
        GreedyOpponent().act(envs.make("kuhn_poker"))

def kuhn_value(strategies):
    """Player 0's expected chips when each seat plays its strategy, over all six deals (exact)."""
    total = Fraction(0)
    for cards in itertools.permutations(range(3), 2):
        def walk(moves):
            game, result = kuhn(cards, moves)
            if result is not None and result.terminated:
                return Fraction(result.rewards[0])
            policy = strategies[game.current_player].policy(game)
            return sum(Fraction(p).limit_denominator(1000) * walk(moves + [m]) for m, p in policy.items() if p)
        total += walk([]) / 6
    return total


@pytest.mark.parametrize("alpha", [0.0, 1 / 6, 1 / 3])
def test_kuhn_equilibrium_gives_the_first_player_minus_one_eighteenth(alpha):
    assert kuhn_value([KuhnEquilibrium(alpha=alpha), KuhnEquilibrium(alpha=alpha)]) == Fraction(-1, 18)


def test_kuhn_equilibrium_cannot_be_exploited_by_always_betting():
    class AlwaysAggressive:
        def policy(self, game):
            return {"bet": 1.0} if "bet" in game.moves() else {"call": 1.0}

    # a deviation by the first player cannot do better than the game value
    assert kuhn_value([AlwaysAggressive(), KuhnEquilibrium()]) <= Fraction(-1, 18)
    with pytest.raises(ValueError, match="alpha"):
        KuhnEquilibrium(alpha=0.5)


def test_kuhn_equilibrium_acts_through_make_and_in_proportion():
    game = envs.make("kuhn_poker")
    game.reset(0)
    game.game.cards = [2, 0]  # the first player holds K: bets with probability 3 * alpha = 1/2
    opponent = KuhnEquilibrium(seed=1, alpha=1 / 6)
    bets = sum(opponent.act(game) == "[bet]" for _ in range(2000))
    assert 900 < bets < 1100
