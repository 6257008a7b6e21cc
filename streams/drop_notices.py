"""Drop notices: the reward actor and replay tell an env actor which of its delivered episodes they dropped.

An env actor counts every training episode it starts against its admission allowance (actors/env/admission.py)
until the learner consumes it. An episode dropped after it was delivered (left unscored by a judge, rejected
whole by reward or replay, refused by replay as too large for any batch) would never be consumed, so without a
word back its place would stay taken for good, and at max_staleness 0 a single drop would stall the run. The
actor that drops it publishes an ``EpisodeDropped`` on the topic of the env actor that played it (the name in
the episode's id); the env actor gives the episode's admission back.

A publisher drops what no subscriber is connected for (a restarted actor's first moments) and what overflows a
subscriber's queue, so each notice goes out ``REPEATS`` times, ``REPEAT_S`` apart; the env actor takes an id once.
A notice lost all the same (an env actor restarted meanwhile) costs nothing: a restarted env actor counts as
started only what replay holds of its predecessors' (``started_before``), and a dropped episode is not there.

    notices = DropNotices(publisher, "reward")
    nursery.start_soon(notices.run)
    notices.dropped("main", episode_id, "unscored")  # never waits
"""

from __future__ import annotations

from collections import deque

import trio

from streams.messages import EpisodeDropped, dropped_topic
from streams.schema import Columns
from streams.wire import FrameCounter, Kind

REPEATS = 3  # each notice goes out this many times ...
REPEAT_S = 1.0  # ... this far apart
MAX_WAITING = 4096  # notices kept to repeat: past this the oldest go out fewer times
MAX_ID_CHARS = 512  # an env actor's ids are far shorter; a longer one is forged, and its notice would not fit a frame


def episode_source(episode_id: str) -> str:
    """The env actor that played an episode: its ids are ``<life>/<actor>-<incarnation>-<n>`` (``EnvActor``)."""
    return episode_id.rpartition("/")[2].rsplit("-", 2)[0]


def episode_identity(episode) -> tuple[str | None, str | None]:
    """An episode table's learning member and id, as its first row says (None where it says nothing usable)."""
    if not episode.num_rows or Columns.EPISODE_ID not in episode.column_names:
        return None, None
    policy = episode.column(Columns.POLICY_ID)[0].as_py() if Columns.POLICY_ID in episode.column_names else None
    return policy, episode.column(Columns.EPISODE_ID)[0].as_py()


class DropNotices:
    """Notices of dropped episodes, published to their env actors and repeated (see the module)."""

    def __init__(self, publisher, sender_name: str):
        self._publisher, self._name = publisher, sender_name
        self._frames: dict[bytes, FrameCounter] = {}  # per topic: each env actor sees its own sequence, gapless
        self._waiting: deque[list] = deque(maxlen=MAX_WAITING)  # [when due, topic, body, times left]
        self._wake = trio.Event()
        self.counts = {"drop_notices": 0}

    def dropped(self, policy_id: str, episode_id: str | None, reason: str) -> None:
        """Tell ``episode_id``'s env actor its episode of ``policy_id`` is dropped for ``reason``. An episode with
        no readable id, or one no env actor makes (a forged one), was started by no env actor: nobody is told."""
        if not isinstance(episode_id, str) or not isinstance(policy_id, str) or \
                len(episode_id) + len(policy_id) > MAX_ID_CHARS:
            return
        body = EpisodeDropped(policy_id, episode_id, reason).to_body()
        self._waiting.append([trio.current_time(), dropped_topic(episode_source(episode_id)), body, REPEATS])
        self.counts["drop_notices"] += 1
        self._wake.set()

    async def run(self) -> None:
        """Publish each notice at once, then again every ``REPEAT_S`` until it went out ``REPEATS`` times."""
        while True:
            next_due = min((notice[0] for notice in self._waiting), default=float("inf"))
            with trio.move_on_at(next_due):
                await self._wake.wait()
            self._wake = trio.Event()
            now = trio.current_time()
            waiting, self._waiting = self._waiting, deque(maxlen=MAX_WAITING)
            for notice in waiting:
                due, topic, body, left = notice
                if due <= now:
                    frames = self._frames.setdefault(topic, FrameCounter(self._name))
                    await self._publisher.publish(topic, frames.frame(Kind.DROPPED, body))
                    notice[0], notice[3] = now + REPEAT_S, left - 1
                if notice[3] > 0:
                    self._waiting.append(notice)
