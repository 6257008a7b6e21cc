"""Evaluation results: games of the policy against a fixed opponent, counted per seat."""

from __future__ import annotations


class EvaluationTally:
    """Wins, draws, losses and games with an invalid action, per seat, and the oldest and newest policy
    version that played a token in any of the games (a game of fixed players only has none)."""

    def __init__(self, tag: str, opponent: str, games_per_seat: int):
        self.tag, self.opponent, self.games_per_seat = tag, opponent, games_per_seat
        self.per_seat: dict[int, dict[str, int]] = {}
        self.version_min: int | None = None
        self.version_max: int | None = None
        self.done = False

    def add(self, seat: int, returns: list[float], columns) -> None:
        """A game with the player in ``seat``: every seat's return, and the player's rows (its episode's columns,
        ``actors.env.columns``: their ``invalid`` and ``versions``)."""
        counts = self.per_seat.get(seat)
        if counts is None:
            counts = self.per_seat[seat] = {"games": 0, "wins": 0, "draws": 0, "losses": 0, "invalid": 0}
        counts["games"] += 1
        # alone in the game (a single-agent task), a positive return is a win
        mine, best_other = returns[seat], max((r for s, r in enumerate(returns) if s != seat), default=0.0)
        counts["wins" if mine > best_other else "losses" if mine < best_other else "draws"] += 1
        counts["invalid"] += any(columns.invalid)
        for tokens in columns.versions:
            if tokens:
                self._see_versions(min(tokens), max(tokens))

    def _see_versions(self, low: int, high: int) -> None:
        if self.version_min is None:
            self.version_min, self.version_max = low, high
        else:
            self.version_min, self.version_max = min(self.version_min, low), max(self.version_max, high)

    def finish(self) -> None:
        self.done = True

    def summary(self) -> dict:
        seats = {seat: dict(c) for seat, c in sorted(self.per_seat.items())}
        nonloss = [1 - c["losses"] / c["games"] for c in seats.values() if c["games"]]
        return {
            "tag": self.tag,
            "opponent": self.opponent,
            "done": self.done,
            "seats": seats,
            "nonloss": sum(nonloss) / len(nonloss) if nonloss else None,  # mean over seats
            "version_min": self.version_min,
            "version_max": self.version_max,
        }
