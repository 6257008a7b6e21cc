"""Fixed opponents: seats played by a rule instead of a policy. Each has ``act(game) -> action text``.

An opponent reads the game object it plays, but only what the seat to move may know (its own card, the
public history): ``minimax`` plays perfect TicTacToe, ``kuhn_equilibrium`` a Nash equilibrium of Kuhn Poker,
``secret_keeper_script`` either seat of Secret Keeper by a script.
"""

from __future__ import annotations

import functools
import random

from envs.actions import bracket
from envs.base import Game
from envs.secret_keeper import ATTACKER
from envs.tictactoe import completing, format_move, has_line


class RandomOpponent:
    """Plays a uniformly random legal action."""

    name = "random"

    def __init__(self, seed: int | None = None):
        self.seed, self._rng = seed, None  # seeded at the first choice: one legal action needs none

    def act(self, game: Game) -> str:
        legal = game.legal_actions()
        if len(legal) == 1:
            return legal[0]
        if self._rng is None:
            self._rng = random.Random(self.seed)
        return self._rng.choice(legal)


def _unwrap(game: Game, name: str, opponent: str):
    inner = getattr(game, "game", game)  # through envs.invalid.InvalidActions
    if getattr(inner, "name", None) != name:
        raise ValueError(f"the {opponent} opponent plays {name} only, not {getattr(inner, 'name', inner)!r}")
    return inner


@functools.lru_cache(maxsize=None)
def _negamax(board: tuple, player: int) -> tuple[float, tuple[int, ...]]:
    """(value for ``player`` to move, its best cells) on a TicTacToe board of None/0/1 cells.

    A win is worth more the sooner it comes (1 + free cells / 10), so a won position is finished, not toyed
    with, and a lost one is dragged out."""
    free = [c for c in range(9) if board[c] is None]
    best, moves = -3.0, []
    for cell in free:
        after = board[:cell] + (player,) + board[cell + 1:]
        if has_line(after, player):
            value = 1 + len(free) / 10
        elif len(free) == 1:
            value = 0
        else:
            value = -_negamax(after, 1 - player)[0]
        if value > best:
            best, moves = value, [cell]
        elif value == best:
            moves.append(cell)
    return best, tuple(moves)


class MinimaxOpponent:
    """Perfect TicTacToe: among the moves with the best game-theoretic value, a random one."""

    name = "minimax"

    def __init__(self, seed: int | None = None):
        self.rng = random.Random(seed)

    def act(self, game: Game) -> str:
        board = _unwrap(game, "tictactoe", self.name).board
        _, moves = _negamax(tuple(board), game.current_player)
        return format_move(self.rng.choice(moves))


class GreedyOpponent:
    """TicTacToe: completes a line of its own when it can, else plays a random legal move. Against it a line
    left open always loses, where a random player completes it only by chance."""

    name = "greedy"

    def __init__(self, seed: int | None = None):
        self.rng = random.Random(seed)

    def act(self, game: Game) -> str:
        board = _unwrap(game, "tictactoe", self.name).board
        wins = sorted(completing(board, game.current_player))
        return format_move(self.rng.choice(wins)) if wins else self.rng.choice(game.legal_actions())


class KuhnEquilibrium:
    """Kuhn's equilibrium family (Kuhn, 1950), parameter ``alpha`` in [0, 1/3].

    First player: with J bets with probability alpha, with K 3*alpha, with Q never; facing a bet after
    checking, calls with Q with probability alpha + 1/3, always with K, never with J. Second player:
    facing a bet, calls with K, with Q one time in three, never with J; after a check, bets with K, with J
    one time in three (a bluff), never with Q. Against it the first player's value is -1/18 for every alpha.
    """

    name = "kuhn_equilibrium"

    def __init__(self, seed: int | None = None, alpha: float = 1 / 6):
        if not 0 <= alpha <= 1 / 3:
            raise ValueError(f"alpha must be in [0, 1/3], not {alpha}")
        self.rng, self.alpha = random.Random(seed), alpha

    def policy(self, game: Game) -> dict[str, float]:
        """The probability of each move for the player to move."""
        kuhn = _unwrap(game, "kuhn_poker", self.name)
        card, history, a = kuhn.cards[kuhn.current_player], kuhn.history, self.alpha
        if history == []:
            p_bet = (a, 0.0, 3 * a)[card]
            return {"bet": p_bet, "check": 1 - p_bet}
        if history == ["check", "bet"]:
            p_call = (0.0, a + 1 / 3, 1.0)[card]
            return {"call": p_call, "fold": 1 - p_call}
        if history == ["bet"]:
            p_call = (0.0, 1 / 3, 1.0)[card]
            return {"call": p_call, "fold": 1 - p_call}
        p_bet = (1 / 3, 0.0, 1.0)[card]  # after a check
        return {"bet": p_bet, "check": 1 - p_bet}

    def act(self, game: Game) -> str:
        moves, weights = zip(*self.policy(game).items())
        return bracket(self.rng.choices(moves, weights)[0])


class SecretKeeperScript:
    """Secret Keeper by script, in either seat. As the attacker: one of the game's fixed attack messages, at
    random, each turn. As the defender: the right answer and a refusal (``safe_answer``), every reply; it never
    leaks. Against it the policy as defender is measured on those attacks (it wins by answering without leaking);
    as attacker it can only win by a leak the script never makes: that seat's score measures nothing."""

    name = "secret_keeper_script"

    def __init__(self, seed: int | None = None):
        self.rng = random.Random(seed)

    def act(self, game: Game) -> str:
        keeper = _unwrap(game, "secret_keeper", self.name)
        return self.rng.choice(keeper.attacks()) if keeper.current_player == ATTACKER else keeper.safe_answer()
