"""Scorers: what the reward actor scores a finished episode with.

A scorer is an object with an async ``score(episode: pa.Table) -> pa.Table`` that returns the episode with
``reward``, ``episode_return`` and ``scored_by`` filled in, or raises `Unscored` (with a reason) for an episode it
could not score: the reward actor then counts it and passes nothing of it on, so that no episode is trained on with
a reward nobody gave it. It also says how many episodes the actor may hand it at once (``concurrency``: a batching
judge gathers several) and what it counted (``statistics()``); one that needs a task of its own (a judge's batcher)
has an async ``run(*, task_status)``, which the reward actor starts beside its loop.

A plain function from an episode table to an episode table (a rule, a verifier) is a scorer too: `FunctionScorer`
wraps it (one episode at a time, ``scored_by`` as the function left it).

How a score that judges a turn becomes rewards (`apply_scores`): each agent's last turn gets the score as its
reward, its earlier turns 0, and every row of the agent gets the score as its ``episode_return``: an agent's return is
the sum of its rewards (`actors.env.columns.EpisodeColumns`), here the one score. A single-turn episode's return
equals its reward. The game's own rewards of a judged agent are replaced, not added to.
"""

from __future__ import annotations

import inspect
from typing import Callable

import pyarrow as pa

from streams.schema import Columns


class Unscored(Exception):
    """The scorer could not score the episode: ``reason`` is counted (``timeout``, ``error``, ``unparsable``...)."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason, self.detail = reason, detail


class FunctionScorer:
    """A plain function ``episode -> episode`` as a scorer: one episode at a time."""

    concurrency = 1

    def __init__(self, function: Callable[[pa.Table], pa.Table]):
        self.function = function

    async def score(self, episode: pa.Table) -> pa.Table:
        return self.function(episode)

    def statistics(self) -> dict:
        return {}


def as_scorer(entry) -> object:
    """``entry`` as a scorer: an object with an async ``score`` as it is, a plain function wrapped."""
    if inspect.iscoroutinefunction(getattr(entry, "score", None)):
        return entry
    if callable(entry):
        return FunctionScorer(entry)
    raise TypeError(f"{entry!r} is neither a function of an episode nor an object with an async score()")


def game_outcome(episode: pa.Table) -> pa.Table:
    """Games score themselves: keep the rewards the environment gave (``scored_by`` stays "")."""
    return episode


def last_turns(episode: pa.Table) -> dict[int, int]:
    """Each agent's last turn in the episode: agent -> the row's index."""
    last: dict[int, tuple[int, int]] = {}
    for index, (agent, turn) in enumerate(zip(episode.column(Columns.AGENT).to_pylist(),
                                              episode.column(Columns.TURN).to_pylist())):
        if agent not in last or turn >= last[agent][0]:
            last[agent] = (turn, index)
    return {agent: index for agent, (_, index) in last.items()}


def apply_scores(episode: pa.Table, scores: dict[int, float], scored_by: str) -> pa.Table:
    """The episode with each scored agent's last turn rewarded ``scores[agent]``, its other turns 0, its return the
    score on all its rows, and ``scored_by`` on them; an agent without a score keeps its rows as they were."""
    last = last_turns(episode)
    agents = episode.column(Columns.AGENT).to_pylist()
    rewards = episode.column(Columns.REWARD).to_pylist()
    returns = episode.column(Columns.EPISODE_RETURN).to_pylist()
    tags = episode.column(Columns.SCORED_BY).to_pylist()
    for index, agent in enumerate(agents):
        if agent in scores:
            score = float(scores[agent])
            rewards[index] = score if last[agent] == index else 0.0
            returns[index], tags[index] = score, scored_by
    for name, values, kind in ((Columns.REWARD, rewards, pa.float32()), (Columns.EPISODE_RETURN, returns, pa.float32()),
                               (Columns.SCORED_BY, tags, pa.string())):
        episode = episode.set_column(episode.schema.get_field_index(name), name, pa.array(values, kind))
    return episode
