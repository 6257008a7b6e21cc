"""Kuhn Poker (Kuhn, 1950): three cards, ante 1, one betting round, two players.

Each player antes 1 and gets one of the cards J < Q < K; the third stays hidden. Player 0 acts first.
Moves: ``[check]`` or ``[bet]`` (one more chip) when no bet is open; ``[call]`` or ``[fold]`` facing a bet.
check-check and bet-call go to a showdown (higher card takes the pot); a fold gives the pot to the other
player. Rewards are net chips won: +-1 (antes only) or +-2 (a called bet). A player sees only its own card.
"""

from __future__ import annotations

import random

from envs.actions import bracket, first_move
from envs.base import StepResult

CARDS = ("J", "Q", "K")
MOVES = ("check", "bet", "call", "fold")
PAST = {"check": "checked", "bet": "bet", "call": "called", "fold": "folded"}


class KuhnPoker:
    name = "kuhn_poker"
    num_players = 2

    def __init__(self):
        self.cards = [0, 1]
        self.history: list[str] = []
        self.done = False

    def reset(self, seed: int = 0) -> None:
        self.cards = random.Random(seed).sample(range(3), 2)
        self.history = []
        self.done = False

    @property
    def current_player(self) -> int:
        return len(self.history) % 2

    @property
    def facing_bet(self) -> bool:
        return "bet" in self.history

    def moves(self) -> list[str]:
        return ["call", "fold"] if self.facing_bet else ["check", "bet"]

    def action_vocabulary(self) -> list[str]:
        return [bracket(m) for m in MOVES]

    def legal_actions(self) -> list[str]:
        return [bracket(m) for m in self.moves()]

    # bumped whenever expert_action() changes: base models warmed up on it are cached under the revision
    expert_revision = 1

    def expert_action(self) -> str | None:
        """What a player who knows only the cards' order does: with the K bet, or call a bet; with the J check,
        or fold to a bet (calling with the J and folding the K are dominated); with the Q check (a bet with the
        Q only folds a J and gets called by a K: against those two undominated answers it never gains); None
        with the Q facing a bet (no opinion: the base model's warm-up then plays a random legal move,
        ``model.tiny.warmup_expert_share``). No bluffs and no mixing: the equilibrium's frequencies are left
        for learning."""
        card = self.cards[self.current_player]
        if card == 1:
            return None if self.facing_bet else bracket("check")
        strong = card == 2
        return bracket(("call" if strong else "fold") if self.facing_bet else ("bet" if strong else "check"))

    def observation(self, player: int) -> str:
        said = ", ".join(f"player {i % 2} {PAST[m]}" for i, m in enumerate(self.history)) or "nothing yet"
        return (f"Kuhn Poker (cards J<Q<K, ante 1). You are player {player}. Your card: {CARDS[self.cards[player]]}.\n"
                f"So far: {said}.\nMoves: {' '.join(self.legal_actions())}\nMove:")

    def step(self, action_text: str) -> StepResult:
        if self.done:
            raise RuntimeError("step() on a finished game; call reset() first")
        legal = self.moves()
        move = first_move(action_text, lambda inside: inside if inside in legal else None)
        if move is None:
            return StepResult([0.0, 0.0], terminated=False, invalid=True,
                              info={"reason": f"play one of {', '.join(legal)} in brackets"})
        self.history.append(move)
        return self._outcome()

    def _outcome(self) -> StepResult:
        h = self.history
        if h == ["check"] or h == ["bet"] or h == ["check", "bet"]:
            return StepResult([0.0, 0.0], terminated=False)
        self.done = True
        if h[-1] == "fold":
            winner, amount = 1 - (len(h) - 1) % 2, 1.0
        else:  # showdown: check-check for the antes, or a called bet
            winner, amount = int(self.cards[1] > self.cards[0]), 2.0 if h[-1] == "call" else 1.0
        rewards = [-amount, -amount]
        rewards[winner] = amount
        return StepResult(rewards, terminated=True,
                          info={"winner": winner, "cards": [CARDS[c] for c in self.cards], "history": list(h)})
