"""Two-player TicTacToe as text.

The board shows a row a line, cells separated by ``|``: a free cell shows its number, 1 to 9 (left to right,
top to bottom), a taken one ``X`` or ``O``. Move format: the number of a free cell in square brackets, e.g.
``[5]``. Text around the brackets is ignored; the first bracketed digit counts. A move that names no cell,
or a taken one, is invalid and changes nothing (``envs.invalid`` decides what it costs).

Rewards: +1 for a win, -1 for a loss, 0 for a draw. Seat 0 plays X and moves first.
"""

from __future__ import annotations

from envs.actions import bracket, first_move
from envs.base import StepResult

LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
MARKS = ("X", "O")
CELLS = tuple(str(n) for n in range(1, 10))


def parse_move(text: str) -> int | None:
    """The cell index (0-8) a text names, or None when it names none."""
    return first_move(text, lambda inside: int(inside) - 1 if inside in CELLS else None)


def format_move(cell: int) -> str:
    return bracket(str(cell + 1))


def has_line(board, player: int) -> bool:
    """Whether ``player`` holds a whole line of ``board``."""
    return any(all(board[i] == player for i in line) for line in LINES)


def win_or_block(board, player: int) -> set[int]:
    """The cells that complete a line of ``player``, to move; where there are none, those that block the
    opponent's (empty when neither is open)."""
    return completing(board, player) or completing(board, 1 - player)


def completing(board, player: int) -> set[int]:
    """The free cells that would complete a line of ``player``."""
    cells = set()
    for line in LINES:
        marks = [board[i] for i in line]
        if marks.count(player) == 2 and marks.count(None) == 1:
            cells.add(line[marks.index(None)])
    return cells


class TicTacToe:
    name = "tictactoe"
    num_players = 2

    def __init__(self):
        self.board: list[int | None] = [None] * 9
        self.moves = 0
        self.done = False

    def reset(self, seed: int = 0) -> None:
        # The game has no chance elements; the seed is kept for the record only.
        self.board = [None] * 9
        self.moves = 0
        self.done = False

    @property
    def current_player(self) -> int:
        return self.moves % 2

    def observation(self, player: int) -> str:
        rows = [
            "|".join(
                MARKS[self.board[cell]] if self.board[cell] is not None else str(cell + 1)
                for cell in range(r, r + 3)
            )
            for r in (0, 3, 6)
        ]
        return f"TicTacToe. You are {MARKS[player]}.\n" + "\n".join(rows) + "\nMove:"

    def action_vocabulary(self) -> list[str]:
        return [format_move(c) for c in range(9)]

    def legal_actions(self) -> list[str]:
        return [format_move(c) for c in range(9) if self.board[c] is None]

    def expert_action(self) -> str | None:
        """The move a player who reads the board's threats makes, where there is one: complete a line of its
        own (the lowest such cell), else block the opponent's; None where neither is open (no expert opinion:
        the base model's warm-up then plays a random legal move, ``model.tiny.warmup_expert_share``)."""
        cells = win_or_block(self.board, self.current_player)
        return format_move(min(cells)) if cells else None

    def step(self, action_text: str) -> StepResult:
        if self.done:
            raise RuntimeError("step() on a finished game; call reset() first")
        player = self.current_player
        cell = parse_move(action_text)
        if cell is None or self.board[cell] is not None:
            reason = "name a free cell, e.g. [5]" if cell is None else f"cell {cell + 1} is taken"
            return StepResult([0.0, 0.0], terminated=False, invalid=True, info={"reason": reason})
        self.board[cell] = player
        self.moves += 1
        if has_line(self.board, player):
            self.done = True
            rewards = [-1.0, -1.0]
            rewards[player] = 1.0
            return StepResult(rewards, terminated=True, info={"winner": player})
        if self.moves == 9:
            self.done = True
            return StepResult([0.0, 0.0], terminated=True, info={"winner": None})
        return StepResult([0.0, 0.0], terminated=False)
