"""The league's matchmaking maths, as pure functions: who plays whom, and when a member is frozen.

After AlphaStar (Vinyals et al., 2019, "Grandmaster level in StarCraft II", Methods: "League composition"
and "Prioritized fictitious self-play"). A player's opponent is drawn with probability proportional to
f(p), p the player's (decayed) win rate against that opponent:

- ``hard``          f(p) = (1 - p)^2      focus on the opponents it still loses to
- ``variance``      f(p) = p (1 - p)      focus on opponents of about its own strength
- ``linear_capped`` f(p) = min(0.5, 1 - p)

Roles: a **main agent** plays itself (a share ``self_play``), fixed opponents (a share ``fixed``) and PFSP
(hard) over every frozen snapshot; a **main exploiter** plays the live main agents, or, while it wins less than
``exploiter_floor`` against them, PFSP (variance) over their snapshots; a **league exploiter** plays PFSP
(linear-capped) over every snapshot. Before any snapshot exists every role plays the live main agents.

Exploiters are reset: once a snapshot of a main exploiter is taken (and of a league exploiter, with a
probability; AlphaStar's is 0.25), its policy starts again from the base model, so it looks for new weaknesses
of the main agents instead of refining the old ones (its snapshot keeps what it found).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

ROLES = ("main", "main_exploiter", "league_exploiter")
WEIGHTINGS = ("hard", "variance", "linear_capped")


def pfsp_weight(win_rate: float, weighting: str) -> float:
    """f(p) of one opponent the player beats with probability ``win_rate``."""
    if not 0.0 <= win_rate <= 1.0:
        raise ValueError(f"a win rate is in [0, 1], not {win_rate}")
    if weighting == "hard":
        return (1.0 - win_rate) ** 2
    if weighting == "variance":
        return win_rate * (1.0 - win_rate)
    if weighting == "linear_capped":
        return min(0.5, 1.0 - win_rate)
    raise ValueError(f"unknown PFSP weighting {weighting!r}; choose one of {', '.join(WEIGHTINGS)}")


def pfsp_probabilities(win_rates: dict[str, float], weighting: str) -> dict[str, float]:
    """Each opponent's probability of being drawn; uniform when every weight is 0 (it beats them all)."""
    weights = {opponent: pfsp_weight(p, weighting) for opponent, p in win_rates.items()}
    total = sum(weights.values())
    if total <= 0.0:
        return {opponent: 1.0 / len(weights) for opponent in weights}
    return {opponent: w / total for opponent, w in weights.items()}


def draw(probabilities: dict[str, float], rng: random.Random) -> str:
    names = list(probabilities)
    return rng.choices(names, weights=[probabilities[n] for n in names])[0]


class Payoff:
    """Decayed wins, draws and games between every pair of players: the payoff matrix of win rates.

    Each new result first multiplies the pair's counts by ``decay``, so the rate follows a player that
    is still learning (AlphaStar's payoff). A pair that never met has rate 0.5.
    """

    def __init__(self, decay: float = 0.99):
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"payoff decay must be in (0, 1], not {decay}")
        self.decay = decay
        self.counts: dict[tuple[str, str], list[float]] = {}  # (a, b) -> [wins of a, draws, games]

    def add(self, a: str, b: str, score: float) -> None:
        """``score``: 1 a won, 0.5 a draw, 0 b won."""
        for key, s in (((a, b), score), ((b, a), 1.0 - score)):
            counts = self.counts.setdefault(key, [0.0, 0.0, 0.0])
            counts[:] = [c * self.decay for c in counts]
            counts[0] += s == 1.0
            counts[1] += s == 0.5
            counts[2] += 1.0

    def win_rate(self, a: str, b: str) -> float:
        wins, draws, games = self.counts.get((a, b), (0.0, 0.0, 0.0))
        return (wins + 0.5 * draws) / games if games > 0 else 0.5

    def games(self, a: str, b: str) -> float:
        return self.counts.get((a, b), (0.0, 0.0, 0.0))[2]

    def matrix(self, players: list[str]) -> list[list[float | None]]:
        """Row a, column b: a's win rate against b (None where they never met)."""
        return [[self.win_rate(a, b) if self.games(a, b) else None for b in players] for a in players]

    def to_json(self) -> dict:
        return {"decay": self.decay, "counts": [[a, b, *c] for (a, b), c in self.counts.items()]}

    @classmethod
    def from_json(cls, data: dict) -> Payoff:
        payoff = cls(data["decay"])
        payoff.counts = {(a, b): [w, d, g] for a, b, w, d, g in data["counts"]}
        return payoff


@dataclass
class MatchmakingConfig:
    self_play: float = 0.35  # main agents: share of games against themselves
    fixed: float = 0.15  # main agents: share of games against a fixed opponent
    fixed_opponents: list[str] = field(default_factory=lambda: ["random"])
    exploiter_floor: float = 0.1  # main exploiters: below this win rate against the mains, play their snapshots
    weightings: dict = field(default_factory=lambda: {"main": "hard", "main_exploiter": "variance",
                                                      "league_exploiter": "linear_capped"})

    def __post_init__(self):
        if not (0 <= self.self_play and 0 <= self.fixed and self.self_play + self.fixed <= 1):
            raise ValueError(f"self_play ({self.self_play}) and fixed ({self.fixed}) shares must be >= 0 and "
                             "add up to at most 1")
        for role, weighting in self.weightings.items():
            if role not in ROLES:
                raise ValueError(f"weightings: unknown role {role!r}; roles are {', '.join(ROLES)}")
            pfsp_weight(0.5, weighting)  # an unknown weighting fails here


def choose_opponent(member: str, role: str, mains: list[str], snapshots: dict[str, str], payoff: Payoff,
                    cfg: MatchmakingConfig, rng: random.Random) -> str:
    """One opponent for ``member`` (a live member, a snapshot id, or a fixed opponent's name).

    ``mains``: the live main agents; ``snapshots``: snapshot id -> the member it was taken from.
    """
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r} of {member}; roles are {', '.join(ROLES)}")
    if role == "main":
        roll = rng.random()
        if roll < cfg.self_play:
            return member
        if roll < cfg.self_play + cfg.fixed:
            return rng.choice(cfg.fixed_opponents)
        if not snapshots:  # nothing frozen yet: itself
            return member
        pool = list(snapshots)
    elif role == "main_exploiter":
        main = rng.choice(mains)
        theirs = [s for s, owner in snapshots.items() if owner == main]
        if not theirs or payoff.win_rate(member, main) >= cfg.exploiter_floor:
            return main
        pool = theirs
    else:
        pool = list(snapshots)
        if not pool:
            return rng.choice(mains)
    rates = {opponent: payoff.win_rate(member, opponent) for opponent in pool}
    return draw(pfsp_probabilities(rates, cfg.weightings.get(role, "hard")), rng)


def seat_match(learner: str, opponent: str, players: int, rng: random.Random,
               choose_more=None) -> list[str]:
    """Seats for one match: ``learner`` in a random seat, ``opponent`` (and for more than two players, one
    more opponent per seat from ``choose_more()``) in the others. A learner against itself fills every seat."""
    if opponent == learner:
        return [learner] * players
    others = [opponent] + [choose_more() if choose_more else opponent for _ in range(players - 2)]
    rng.shuffle(others)
    seat = rng.randrange(players)
    return others[:seat] + [learner] + others[seat:]


def snapshot_due(version: int, last_snapshot_version: int | None, win_rate: float | None, *, every_versions: int,
                 min_versions: int, win_rate_threshold: float | None) -> bool:
    """Freeze a member now? Every ``every_versions`` learner versions, or sooner (after at least ``min_versions``
    since its last snapshot) once its win rate against the league's snapshots reaches ``win_rate_threshold``."""
    since = version - (last_snapshot_version if last_snapshot_version is not None else 0)
    if every_versions and since >= every_versions:
        return True
    return (win_rate_threshold is not None and win_rate is not None and since >= max(min_versions, 1)
            and win_rate >= win_rate_threshold)


def check_reset_probabilities(probabilities: dict[str, float]) -> None:
    """``{role: probability}`` of a reset after a snapshot: exploiter roles only, probabilities in [0, 1]."""
    for role, p in probabilities.items():
        if role not in ROLES or role == "main":
            raise ValueError(f"reset_after_snapshot: {role!r} cannot be reset; exploiter roles are "
                             f"{', '.join(r for r in ROLES if r != 'main')}")
        if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0.0 <= p <= 1.0:
            raise ValueError(f"reset_after_snapshot: the probability for {role} must be in [0, 1], not {p!r}")


def reset_after_snapshot(role: str, probabilities: dict[str, float], rng: random.Random) -> bool:
    """Reset a member of ``role`` to the base model now that its snapshot is taken? With the role's probability
    (a role not listed is never reset); the random generator is drawn only for a probability strictly between
    0 and 1, so a certain answer leaves the draws after it as they were."""
    p = probabilities.get(role, 0.0)
    if p >= 1.0 or p <= 0.0:
        return p >= 1.0
    return rng.random() < p


def pairwise_scores(seats: list[str], returns: list[float], learner: str) -> list[tuple[str, float]]:
    """(opponent, the learner's score against it) for every seat the learner does not hold: 1 for the higher
    return, 0.5 for equal returns."""
    mine = max(r for s, r in zip(seats, returns) if s == learner)
    return [(s, 1.0 if mine > r else 0.5 if mine == r else 0.0) for s, r in zip(seats, returns) if s != learner]


def result_problem(learner: str, seats: list[str], returns: list[float], members, players: int) -> tuple[str, str]:
    """(reason, what is wrong) with a match result the league must not keep ("", "" for a good one): a learner
    that is no member of the league or holds no seat (nothing to score it by), seats other than the game's
    ``players``, or a return that is not a finite number."""
    if learner not in members:
        return "unknown_learner", f"learner {learner!r} is not a member of the league"
    if learner not in seats:
        return "seatless_learner", f"learner {learner!r} holds none of the seats {seats}"
    if len(seats) != players or len(returns) != len(seats):
        return "seats", f"{len(seats)} seats and {len(returns)} returns in a game of {players} players"
    if not all(isinstance(r, (int, float)) and not isinstance(r, bool) and math.isfinite(r) for r in returns):
        return "non_finite", f"returns {returns} are not all finite numbers"
    return "", ""
