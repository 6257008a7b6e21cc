"""OldestFirst: the episodes replay holds, taken oldest policy version first and cut into batches by count and bytes.

The order is the episode's oldest token's policy version, then arrival among equals (a FIFO while versions arrive
in order): an episode that finished late goes into the next batch instead of queueing behind newer ones until the
learner's staleness bound rejects it (see `actors.replay.actor`).

A batch holds ``batch_episodes`` episodes, or fewer where the next would take its body past the byte limit. The
size is reckoned exactly: the bytes of an Arrow IPC stream of no rows (the batch's own), plus each episode's record
batches as written. The limit is asked for at every decision, so a limit changed at run time holds. A plain class:
no loop, no streams; the actor owns the waiting, the counting and the spill.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc

from streams.schema import TRAJECTORY_SCHEMA, Columns, encode_table


class OldestFirst:
    """Episodes held for batches, oldest policy version first; ``limit()`` is the largest batch body, in bytes."""

    def __init__(self, batch_episodes: int, limit: Callable[[], int]):
        self.batch_episodes, self.limit = batch_episodes, limit
        self.overhead = len(encode_table(TRAJECTORY_SCHEMA.empty_table(), batch_seq=10**18))  # a batch's own bytes
        self.bytes = 0  # the held episodes' bytes in a batch
        self._heap: list[tuple[int, int, int, pa.Table]] = []  # (oldest token version, arrival, bytes, episode)
        self._arrivals = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def batch_bytes(self, episodes: list[pa.Table]) -> int:
        """The exact size of a batch body of ``episodes``: each one's record batches, and the stream's own."""
        return self.overhead + sum(episode_bytes(e) for e in episodes)

    def fits(self, episodes: list[pa.Table]) -> bool:
        """Whether ``episodes`` make one batch within the limit (one episode: whether it can go out at all)."""
        return self.batch_bytes(episodes) <= self.limit()

    def hold(self, episode: pa.Table) -> None:
        size = episode_bytes(episode)
        heapq.heappush(self._heap, (oldest_version(episode), next(self._arrivals), size, episode))
        self.bytes += size

    def ready(self) -> bool:
        """A batch can go: ``batch_episodes`` are held, or those held already fill a batch's bytes."""
        return len(self._heap) >= self.batch_episodes or self.bytes + self.overhead > self.limit()

    def cut(self) -> list[pa.Table]:
        """The oldest episodes, up to ``batch_episodes`` of them and as many as fit the batch's bytes (the first
        goes whatever its size: one that cannot fit alone is refused before it is held)."""
        room = self.limit() - self.overhead
        episodes = []
        while self._heap and len(episodes) < self.batch_episodes and (not episodes or self._heap[0][2] <= room):
            _, _, size, episode = heapq.heappop(self._heap)
            episodes.append(episode)
            room -= size
            self.bytes -= size
        return episodes


def oldest_version(episode: pa.Table) -> int:
    """The policy version of the episode's oldest token (0 for an episode without tokens)."""
    versions = pc.list_flatten(episode.column(Columns.POLICY_VERSIONS))
    oldest = pc.min(versions).as_py()
    return 0 if oldest is None else int(oldest)


def episode_bytes(episode: pa.Table) -> int:
    """What an episode adds to a batch's Arrow IPC stream: its record batches, as written."""
    return sum(pa.ipc.get_record_batch_size(batch) for batch in episode.to_batches())
