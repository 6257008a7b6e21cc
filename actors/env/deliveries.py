"""Finished training episodes to their learner's reward actor, a batch at a time.

Episodes that finish while the previous batch is being sent wait together; their columns (``actors.env.columns``)
become one Arrow table (``schema.encode_episode_columns``: Arrow's fixed cost per column is paid once a batch, not
once an episode; no row is ever a dict), sliced
into one IPC stream per episode. What is on the wire is unchanged: one frame an episode, the reward actor's unit
of acknowledgement, sent in the order the episodes finished. ``post`` returns at once; ``sent`` is called with each
batch's episodes once their frames are sent (the stream's credit taken, as a direct send would), so backpressure
and the ledger hold as before.
"""

from __future__ import annotations

from typing import Callable

import trio

from streams.endpoints import Outbox
from streams.schema import encode_episode_columns


class Deliveries:
    """Per learning member, a queue of finished episodes and the task that sends them (``run``); ``sent`` is told
    of each batch sent: ``(member, [(item, None or the episode's SchemaError)])``, ``item`` as it was posted."""

    def __init__(self, outboxes: dict[str, Outbox], sent: Callable[[str, list[tuple[object, Exception | None]]], None]):
        self._outboxes, self._sent = outboxes, sent
        self._pending: dict[str, list[tuple[dict[str, list], object]]] = {m: [] for m in outboxes}
        self._wake = {member: trio.Event() for member in outboxes}
        self.counts = {"delivery_batches": 0}

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            for member in self._outboxes:
                nursery.start_soon(self._send, member)

    def post(self, learner: str, columns: dict[str, list], item) -> None:
        """Send an episode's rows (its ``columns``: every column's values; one frame) in the next batch. SchemaError
        for rows that do not fit the schema is the episode's only: the others of its batch go out."""
        self._pending[learner].append((columns, item))
        self._wake[learner].set()

    async def _send(self, member: str) -> None:
        outbox = self._outboxes[member]
        while True:
            await self._wake[member].wait()
            self._wake[member] = trio.Event()
            batch, self._pending[member] = self._pending[member], []
            self.counts["delivery_batches"] += 1
            sent = []
            try:
                for (_, item), body in zip(batch, _encoded([columns for columns, _ in batch])):
                    if isinstance(body, Exception):
                        sent.append((item, body))
                    else:
                        await outbox.send(body)
                        sent.append((item, None))
            finally:
                self._sent(member, sent)


def _encoded(episodes: list[dict[str, list]]) -> list[bytes | Exception]:
    """Each episode's frame body; where the batch does not fit the schema, each episode on its own, so that the
    error is the bad episode's."""
    try:
        return encode_episode_columns(episodes)
    except Exception:
        results = []
        for columns in episodes:
            try:
                results.extend(encode_episode_columns([columns]))
            except Exception as error:
                results.append(error)
        return results
