"""RewardActor: scores finished episodes, then hands them to replay.

An episode is acknowledged to its env actor only once replay has acknowledged the scored one (the receiver's
``ack_when_done``, and a drain before the next): a reward actor killed at any point loses nothing; what it had
not passed on is sent to its successor again, and replay drops a second copy.

Game outcomes are already rewards, so the default scorer passes them through; verifiers and judges plug in
here as scorers: functions from an episode table to an episode table with ``reward`` and
``episode_return`` filled in.

Every episode's rows are checked before they are scored (`streams.values.check_rows`): a row with a null or
missing id, ragged per-token lists, a negative token id or version, or a non-finite value is rejected, counted by
reason (``rejected_rows``) and logged at a bounded rate; the episode's other rows go on, and an episode left with
no row is not passed on at all.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import pyarrow as pa
import trio

from streams.endpoints import Inbox, Outbox
from streams.schema import Columns, decode_table, encode_table
from streams.values import Rejections, check_rows
from streams.wire import Kind


def game_outcome(episode: pa.Table) -> pa.Table:
    """Games score themselves: keep the rewards the environment gave."""
    return episode


SCORERS: dict[str, Callable[[pa.Table], pa.Table]] = {"game_outcome": game_outcome}


@dataclass
class RewardConfig:
    scorer: str = "game_outcome"


class RewardActor:
    def __init__(self, cfg: RewardConfig, name: str = "reward"):
        if cfg.scorer not in SCORERS:
            raise ValueError(f"unknown scorer {cfg.scorer!r}; known: {', '.join(sorted(SCORERS))}")
        self.cfg, self.name, self.score = cfg, name, SCORERS[cfg.scorer]
        self._stats = {"episodes": 0, "rows": 0, "rejected_episodes": 0}
        self._rejected = Rejections(f"{name}: episode rows")
        self._inbox = None

    async def run(self, transport, peers: dict, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with (
            transport.open_receiver(capacity=16, ack_when_done=True) as episodes,
            transport.open_sender(peers["replay"], capacity=16) as replay,
        ):
            self._inbox = Inbox(episodes, Kind.EPISODES, decode_table)
            outbox = Outbox(replay, Kind.EPISODES, self.name)
            task_status.started({"episodes": episodes.address})
            while True:
                episode = self._checked(await self._inbox.receive())
                if episode is None:
                    continue  # acknowledged at the next receive: nothing of it is kept
                episode = self.score(episode)
                scored = episode.set_column(
                    episode.schema.get_field_index(Columns.SCORED_AT), Columns.SCORED_AT,
                    pa.array([time.time()] * episode.num_rows, pa.float64()))
                await outbox.send(encode_table(scored))
                await replay.drain()  # replay has it (spilled) before the env actor is told we have
                self._stats["episodes"] += 1
                self._stats["rows"] += scored.num_rows

    def _checked(self, episode: pa.Table) -> pa.Table | None:
        """The episode's usable rows (None: none is)."""
        checked = check_rows(episode, one_episode=True)
        if checked.rejected:
            self._rejected.add(checked.rejected, checked.example)
        if checked.table.num_rows or not episode.num_rows:
            return checked.table
        self._stats["rejected_episodes"] += 1
        return None

    def statistics(self) -> dict:
        inbox = self._inbox.statistics() if self._inbox else {}
        return {**self._stats, "rejected_rows": self._rejected.total(), "rejected_by_reason": dict(self._rejected.counts),
                "dropped_frames": inbox.get("dropped_frames", 0), "streams": {"episodes": inbox}}
