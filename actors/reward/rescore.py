"""The reward audit of ``tidal replay --rescore``: every trained episode scored again, and the differences counted.

Each batch the learner trained (in the ledger's order: ``actors/learner/ledger.py``), read from the episode
dataset by the caller, is cut into its episodes, and each episode is handed to a scorer made from a reward config (the run's, or
another's: ``reward.args.scorer=judge ...``) exactly as the reward actor would hand it. An episode differs when a
row's reward or return is not the one trained on (float32, bit for bit). An episode some of whose turns the
staleness bound dropped before training is ``partial``: only its returns are compared (a judge rewards an agent's
last turn, which may be one that was dropped). ``scored_by`` (the judge's identity) is reported for both sides.

Beside it, a check that needs no scorer: an agent's return is the sum of its rewards (``EpisodeColumns``), so a
whole episode whose rows say otherwise is counted ``inconsistent``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Iterable

import numpy as np
import pyarrow as pa
import trio

from actors.reward.actor import RewardConfig, make_scorer
from actors.reward.scorers import Unscored
from streams.schema import Columns

RETURN_TOLERANCE = 1e-4  # of the return-is-the-sum check (float32 sums)


def episodes_of(table: pa.Table) -> list[pa.Table]:
    """The batch's episodes, each with its rows in the batch's order."""
    ids = table.column(Columns.EPISODE_ID).to_pylist()
    rows: dict[str, list[int]] = defaultdict(list)
    for index, episode in enumerate(ids):
        rows[episode].append(index)
    return [table.take(pa.array(indices)) for indices in rows.values()]


def consistent(episode: pa.Table) -> bool:
    """Is each agent's return the sum of its rewards on every one of its rows?"""
    agents = np.asarray(episode.column(Columns.AGENT).to_pylist())
    rewards = episode.column(Columns.REWARD).to_numpy().astype(np.float64)
    returns = episode.column(Columns.EPISODE_RETURN).to_numpy().astype(np.float64)
    return all(np.allclose(returns[agents == a], rewards[agents == a].sum(), atol=RETURN_TOLERANCE)
               for a in np.unique(agents))


def rescore(batches: Iterable[tuple[dict, pa.Table]], reward_cfg: RewardConfig, out: Path) -> dict:
    """Score every episode of ``batches`` (each a ledger's update entry and the batch it trained) again with
    ``reward_cfg``'s scorer; the counts, and ``rescore.jsonl`` in ``out`` naming each episode that differs."""
    return trio.run(_rescore, batches, reward_cfg, out)


async def _rescore(batches: Iterable[tuple[dict, pa.Table]], reward_cfg: RewardConfig, out: Path) -> dict:
    scorer = make_scorer(reward_cfg)
    counts = {"episodes": 0, "rescored_differ": 0, "partial": 0, "unscored": 0, "inconsistent": 0,
              "scorer": reward_cfg.scorer}
    out.mkdir(parents=True, exist_ok=True)
    async with trio.open_nursery() as nursery:
        if hasattr(scorer, "run"):  # a judge's batcher
            await nursery.start(scorer.run)
        with open(out / "rescore.jsonl", "w") as differences:
            for entry, table in batches:
                dropped = {row[0] for row in entry["dropped"]["rows"]}
                for episode in episodes_of(table):
                    await _one(scorer, episode, dropped, entry, counts, differences)
        nursery.cancel_scope.cancel()
    return counts


async def _one(scorer, episode: pa.Table, dropped: set, entry: dict, counts: dict, differences) -> None:
    name = episode.column(Columns.EPISODE_ID)[0].as_py()
    partial = name in dropped
    counts["episodes"] += 1
    counts["partial"] += partial
    if not partial and not consistent(episode):
        counts["inconsistent"] += 1
    try:
        again = await scorer.score(episode)
    except Unscored as unscored:
        counts["unscored"] += 1
        differences.write(json.dumps({"episode": name, "version": entry["version"], "unscored": str(unscored)}) + "\n")
        return
    columns = (Columns.EPISODE_RETURN,) if partial else (Columns.REWARD, Columns.EPISODE_RETURN)
    if all(episode.column(c).equals(again.column(c)) for c in columns):
        return
    counts["rescored_differ"] += 1
    differences.write(json.dumps({
        "episode": name, "version": entry["version"], "batch": entry["batch"], "partial": partial,
        "recorded": {c: episode.column(c).to_pylist() for c in (*columns, Columns.SCORED_BY)},
        "rescored": {c: again.column(c).to_pylist() for c in (*columns, Columns.SCORED_BY)}}) + "\n")
