"""Evaluations: games of a policy against a fixed opponent, split across the env actors, on a schedule.

An ``Evaluation`` is one matchup's games: each env actor plays its share (``EnvActor.evaluate``) and keeps its
tally under the evaluation's tag; the driver merges the shares once every one is done. A restarted env actor
plays its whole share again. ``Evaluations`` is the run's schedule: a round at the start (or on resume), one
every ``eval.every_s`` while training, and one at the end. A single-policy run's round is its policy against
``eval.opponent``; a league's is every main agent against each of ``eval.opponents``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from actors.env.face import EnvFace, EnvStatistics
from actors.runs.config import EvalSection
from actors.runs.handles import handle

POLICY = "policy"  # the env actors' own policy (a single-policy run's player)


class Evaluation:
    """One evaluation round, split across the env actors, collected when every share is done."""

    def __init__(self, cluster, envs: list[str], tag: str, games_per_seat: int, opponent: str,
                 player: str = "policy"):
        """``player``: the env actors' own policy, or (a league) a member's id."""
        self.cluster, self.envs, self.tag, self.opponent, self.player = cluster, envs, tag, opponent, player
        shares = [games_per_seat // len(envs) + (i < games_per_seat % len(envs)) for i in range(len(envs))]
        self.started = time.time()
        self.shares = {env: share for env, share in zip(envs, shares) if share}
        for env, share in self.shares.items():
            handle(cluster, env, EnvFace).evaluate(tag, share, opponent, player)
        self.envs = list(self.shares)

    def restarted(self, env: str) -> None:
        """``env`` died with its share of the games: its successor plays the whole share again."""
        if env in self.shares:
            handle(self.cluster, env, EnvFace).evaluate(self.tag, self.shares[env], self.opponent, self.player)

    def result(self, env_stats: Mapping[str, EnvStatistics]) -> dict | None:
        """The merged result once every env actor has finished its share, else None."""
        parts = [next((e for e in env_stats[env]["evaluations"] if e["tag"] == self.tag), None) for env in self.envs]
        if any(p is None or not p["done"] for p in parts):
            return None
        seats: dict[str, dict[str, int]] = {}
        for part in parts:
            for seat, counts in part["seats"].items():
                total = seats.setdefault(str(seat), dict.fromkeys(counts, 0))
                for key, value in counts.items():
                    total[key] += value
        nonloss = {seat: 1 - c["losses"] / c["games"] for seat, c in seats.items()}
        versions = [v for p in parts for v in (p["version_min"], p["version_max"]) if v is not None]
        return {
            "tag": self.tag, "opponent": self.opponent, "seats": seats,
            "nonloss_by_seat": nonloss, "nonloss": sum(nonloss.values()) / len(nonloss), "player": self.player,
            "win_rate": sum(c["wins"] for c in seats.values()) / max(sum(c["games"] for c in seats.values()), 1),
            "invalid_rate": sum(c["invalid"] for c in seats.values()) / sum(c["games"] for c in seats.values()),
            "version_min": min(versions, default=None), "version_max": max(versions, default=None),
            "seconds": time.time() - self.started,
        }


class Evaluations:
    """The evaluation rounds of a run: started, collected as their games end, and their results kept."""

    def __init__(self, cluster, envs: list[str], cfg: EvalSection, mains: list[str] | None, results: list[dict]):
        """``mains``: a league's main agents (None: a single-policy run); ``results``: what a resumed run already
        measured (its ``during-`` rounds are numbered on from there)."""
        self.cluster, self.envs, self.cfg, self.league = cluster, envs, cfg, mains is not None
        self.matchups = [(POLICY, cfg.opponent)] if mains is None else [(m, o) for m in mains for o in cfg.opponents]
        self.results = results
        self.open: list[Evaluation] = []  # under way: a restarted env actor plays its share again
        self.rounds = len({r["tag"] for r in results if r["tag"].startswith("during-")}) // max(len(self.matchups), 1)

    def start(self, tag: str, games_per_seat: int) -> None:
        """A round: every matchup's games, side by side."""
        for player, opponent in self.matchups:
            name = f"{tag}-{player}-{opponent}" if self.league else tag
            self.open.append(Evaluation(self.cluster, self.envs, name, games_per_seat, opponent, player))

    def start_during(self) -> None:
        self.rounds += 1
        self.start(f"during-{self.rounds}", self.cfg.games_per_seat)

    def collect(self, stats: dict[str, Any]) -> list[dict]:
        """The results of the open evaluations whose games have all ended (they are closed)."""
        done = [(e, r) for e in self.open if (r := e.result(stats)) is not None]
        for evaluation, _ in done:
            self.open.remove(evaluation)
        return [result for _, result in done]

    def restarted(self, env: str) -> None:
        for evaluation in self.open:
            evaluation.restarted(env)
