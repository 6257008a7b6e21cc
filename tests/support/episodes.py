"""What the episode and lane-group tests share: a fake tokenizer and a game whose seats move at once."""

from envs.base import StepResult


class CharCodec:
    """A fake tokenizer: one token per character, its code point."""

    hits = 0

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(map(chr, ids))


class Quorum:
    """A game of roles: seat 0 names a number, then seats 1..k each guess it, seeing only the question; the
    guessers' moves do not depend on each other (``simultaneous_players``). Rewards at the end."""

    name, num_players = "quorum", 4
    roles = ["asker", "guesser", "guesser", "guesser"]

    def reset(self, seed: int) -> None:
        self.moves: list[str] = []

    @property
    def current_player(self) -> int:
        return len(self.moves)

    def simultaneous_players(self) -> list[int]:
        return list(range(len(self.moves), 4)) if self.moves else []

    def observation(self, player: int) -> str:
        return "ask" if player == 0 else f"guess {player}"

    def step(self, action_text: str):
        self.moves.append(action_text)
        done = len(self.moves) == 4
        right = sum(m == self.moves[0] for m in self.moves[1:])
        return StepResult(rewards=[float(right), *[float(m == self.moves[0]) for m in self.moves[1:]], 0.0, 0.0][:4]
                          if done else [0.0] * 4, terminated=done)

    def legal_actions(self) -> list[str]:
        return []
