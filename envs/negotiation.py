"""Simple Negotiation: two players trade resources whose values each of them knows only for themselves.

Each player starts with 1 to 5 units of wood, stone and gold, and values each unit of a resource at 1 to
10 (private). Moves, in turn:

- ``[offer 2 wood 1 gold for 3 stone]``: give what is before ``for``, get what is after; it must give and
  get something, and the offerer must have what it gives. It replaces any offer it had open.
- ``[accept]``: take the other player's open offer (the accepter must have what it gives); the trade happens.
- ``[deny]``: turn the open offer down.

After ``max_turns`` moves the game ends. A player's gain is the value of its inventory, at its own prices,
minus what it started with; the larger gain wins (+1, the other -1; equal gains draw, 0 each).

A move that cannot be read is invalid, and so is an offer that asks for more of a resource than the table
holds (both players' units together): quantities are ASCII digits (``envs.actions.read_int``).
"""

from __future__ import annotations

import random

from envs.actions import bracket, first_move, read_int
from envs.base import StepResult

RESOURCES = ("wood", "stone", "gold")


def _bundle(text: str) -> dict[str, int] | None:
    """``2 wood 1 gold`` (or ``2 wood, 1 gold`` / ``2 wood and 1 gold``) as counts; None if unreadable."""
    words = text.replace(",", " ").replace(" and ", " ").split()
    if not words or len(words) % 2:
        return None
    bundle: dict[str, int] = {}
    for i in range(0, len(words), 2):
        count, resource = read_int(words[i]), words[i + 1] if words[i + 1] == "gold" else words[i + 1].rstrip("s")
        if not count or resource not in RESOURCES:
            return None
        bundle[resource] = bundle.get(resource, 0) + count
    return bundle


def _show(bundle: dict[str, int]) -> str:
    return " ".join(f"{n} {r}" for r, n in bundle.items())


class SimpleNegotiation:
    name = "negotiation"
    num_players = 2

    def __init__(self, max_turns: int = 8):
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, not {max_turns}")
        self.max_turns = max_turns
        self.done = False

    def reset(self, seed: int = 0) -> None:
        rng = random.Random(seed)
        self.inventory = [{r: rng.randint(1, 5) for r in RESOURCES} for _ in range(2)]
        self.values = [{r: rng.randint(1, 10) for r in RESOURCES} for _ in range(2)]
        self.start_value = [self.value(p) for p in range(2)]
        self.pool = {r: sum(inventory[r] for inventory in self.inventory) for r in RESOURCES}  # trades keep it
        self.offer: tuple[int, dict, dict] | None = None  # (offerer, gives, gets)
        self.turns, self.trades = 0, 0
        self.log: list[str] = []
        self.done = False

    def value(self, player: int) -> int:
        return sum(self.inventory[player][r] * self.values[player][r] for r in RESOURCES)

    @property
    def current_player(self) -> int:
        return self.turns % 2

    def _has(self, player: int, bundle: dict[str, int]) -> bool:
        return all(self.inventory[player][r] >= n for r, n in bundle.items())

    def _read(self, inside: str):
        player = self.current_player
        open_offer = self.offer is not None and self.offer[0] != player
        if inside in ("accept", "deny"):
            if not open_offer or (inside == "accept" and not self._has(player, self.offer[2])):
                return None
            return (inside,)
        if inside.startswith("offer ") and " for " in inside:
            gives, gets = (_bundle(part) for part in inside[len("offer "):].split(" for ", 1))
            if gives and gets and self._has(player, gives) and all(n <= self.pool[r] for r, n in gets.items()):
                return ("offer", gives, gets)
        return None

    def action_vocabulary(self) -> list[str]:
        """A finite menu (for PettingZoo and random play): accept, deny, one or two of a resource for one
        or two of another. The text interface takes any bundles."""
        offers = [bracket(f"offer {a} {give} for {b} {get}")
                  for give in RESOURCES for get in RESOURCES if give != get for a in (1, 2) for b in (1, 2)]
        return [bracket("accept"), bracket("deny")] + offers

    def legal_actions(self) -> list[str]:
        return [action for action in self.action_vocabulary()
                if self._read(" ".join(action[1:-1].split())) is not None]

    def observation(self, player: int) -> str:
        mine = ", ".join(f"{self.inventory[player][r]} {r} (worth {self.values[player][r]} each to you)"
                         for r in RESOURCES)
        offer = "none"
        if self.offer is not None:
            who = "you" if self.offer[0] == player else "the other player"
            offer = f"{who} give {_show(self.offer[1])} for {_show(self.offer[2])}"
        history = "\n".join(self.log[-4:]) or "no moves yet"
        return (f"Simple Negotiation. You are player {player}; {self.max_turns - self.turns} moves left.\n"
                f"You have: {mine}.\nOpen offer: {offer}.\nRecent moves:\n{history}\n"
                f"Moves: [offer N RESOURCE ... for N RESOURCE ...], [accept], [deny].\nMove:")

    def step(self, action_text: str) -> StepResult:
        if self.done:
            raise RuntimeError("step() on a finished game; call reset() first")
        move = first_move(action_text, self._read)
        if move is None:
            return StepResult([0.0, 0.0], terminated=False, invalid=True,
                              info={"reason": "offer what you have for at most what the table holds, "
                                                "or accept/deny an open offer you can pay"})
        player = self.current_player
        if move[0] == "offer":
            self.offer = (player, move[1], move[2])
            self.log.append(f"player {player} offered {_show(move[1])} for {_show(move[2])}")
        elif move[0] == "accept":
            offerer, gives, gets = self.offer
            for r, n in gives.items():
                self.inventory[offerer][r] -= n
                self.inventory[player][r] += n
            for r, n in gets.items():
                self.inventory[player][r] -= n
                self.inventory[offerer][r] += n
            self.offer, self.trades = None, self.trades + 1
            self.log.append(f"player {player} accepted")
        else:
            self.offer = None
            self.log.append(f"player {player} denied")
        self.turns += 1
        if self.turns < self.max_turns:
            return StepResult([0.0, 0.0], terminated=False)
        self.done = True
        gains = [self.value(p) - self.start_value[p] for p in range(2)]
        rewards = [0.0, 0.0] if gains[0] == gains[1] else [1.0, -1.0] if gains[0] > gains[1] else [-1.0, 1.0]
        winner = None if gains[0] == gains[1] else int(gains[1] > gains[0])
        return StepResult(rewards, terminated=True, info={"winner": winner, "gains": gains, "trades": self.trades})
