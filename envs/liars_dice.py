"""Liar's Dice for 2 to 6 players.

Every player has ``dice`` six-sided dice, seen only by their owner. Players bid in turn on how many dice
on the whole table show a face: ``[bid 3 5]`` says "at least three fives". A bid must raise the last one
(more dice, or as many dice of a higher face). Instead of raising, a player may challenge the last bid
with ``[liar]``: all dice are shown; if the bid holds, the challenger loses a die, otherwise the bidder
does. The loser opens the next round (or the next player, if it is out of dice); everyone rolls again.
There are no wild faces. The last player with dice wins: +1, every other player -1/(players-1).
A move that is not ``[liar]`` on an open bid or a higher bid in ASCII digits (``envs.actions.read_int``) is
invalid.
"""

from __future__ import annotations

import random

from envs.actions import bracket, first_move, read_int
from envs.base import StepResult

FACES = range(1, 7)


class LiarsDice:
    name = "liars_dice"

    def __init__(self, players: int = 2, dice: int = 2):
        if not 2 <= players <= 6:
            raise ValueError(f"Liar's Dice takes 2 to 6 players, not {players}")
        if dice < 1:
            raise ValueError(f"dice must be >= 1, not {dice}")
        self.num_players, self.dice = players, dice
        self.done = False

    def reset(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.counts = [self.dice] * self.num_players  # dice each player has left
        self.turn, self.round = 0, 0
        self.done = False
        self.last_round = ""  # what the last challenge showed
        self._roll()

    def _roll(self) -> None:
        self.hands = [sorted(self.rng.randint(1, 6) for _ in range(n)) for n in self.counts]
        self.bid: tuple[int, int] | None = None  # (quantity, face)
        self.bidder: int | None = None

    @property
    def current_player(self) -> int:
        return self.turn

    def _next_alive(self, player: int) -> int:
        for step in range(1, self.num_players + 1):
            candidate = (player + step) % self.num_players
            if self.counts[candidate]:
                return candidate
        raise AssertionError("no player has dice")

    def _raises(self, quantity: int, face: int) -> bool:
        if not (1 <= quantity <= sum(self.counts) and face in FACES):
            return False
        return self.bid is None or (quantity, face) > self.bid

    def action_vocabulary(self) -> list[str]:
        total = self.num_players * self.dice
        return [bracket(f"bid {q} {f}") for q in range(1, total + 1) for f in FACES] + [bracket("liar")]

    def legal_actions(self) -> list[str]:
        bids = [bracket(f"bid {q} {f}") for q in range(1, sum(self.counts) + 1) for f in FACES if self._raises(q, f)]
        return bids + ([bracket("liar")] if self.bid else [])

    def observation(self, player: int) -> str:
        table = ", ".join(f"player {p}: {n}" for p, n in enumerate(self.counts))
        bid = f"{self.bid[0]} x {self.bid[1]} by player {self.bidder}" if self.bid else "none (you open)"
        return (f"Liar's Dice, {self.num_players} players. You are player {player}. Your dice: "
                f"{' '.join(map(str, self.hands[player]))}.\nDice left: {table}.\n{self.last_round}"
                f"Current bid: {bid}.\nMoves: [bid QUANTITY FACE] (a higher bid) or [liar].\nMove:")

    def _read(self, inside: str):
        if inside == "liar":
            return ("liar",) if self.bid else None
        parts = inside.split()
        if len(parts) != 3 or parts[0] != "bid":
            return None
        quantity, face = read_int(parts[1]), read_int(parts[2])
        if quantity is None or face is None or not self._raises(quantity, face):
            return None
        return ("bid", quantity, face)

    def step(self, action_text: str) -> StepResult:
        if self.done:
            raise RuntimeError("step() on a finished game; call reset() first")
        move = first_move(action_text, self._read)
        zeros = [0.0] * self.num_players
        if move is None:
            return StepResult(zeros, terminated=False, invalid=True,
                              info={"reason": "raise the bid with [bid QUANTITY FACE], or say [liar]"})
        if move[0] == "bid":
            self.bid, self.bidder = (move[1], move[2]), self.turn
            self.turn = self._next_alive(self.turn)
            return StepResult(zeros, terminated=False)
        return self._challenge()

    def _challenge(self) -> StepResult:
        quantity, face = self.bid
        shown = sum(hand.count(face) for hand in self.hands)
        loser = self.turn if shown >= quantity else self.bidder
        self.counts[loser] -= 1
        self.last_round = (f"Last round: player {self.turn} called liar on {quantity} x {face}; the table had "
                           f"{shown}; player {loser} lost a die.\n")
        self.round += 1
        alive = [p for p, n in enumerate(self.counts) if n]
        if len(alive) == 1:
            self.done = True
            rewards = [-1.0 / (self.num_players - 1)] * self.num_players
            rewards[alive[0]] = 1.0
            return StepResult(rewards, terminated=True, info={"winner": alive[0], "rounds": self.round})
        self.turn = loser if self.counts[loser] else self._next_alive(loser)
        self._roll()
        return StepResult([0.0] * self.num_players, terminated=False, info={"round_loser": loser})
