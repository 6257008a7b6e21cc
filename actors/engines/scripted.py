"""A scripted rollout: answers generation requests by a rule instead of a model (tests and benchmarks).

It speaks the rollout actor's protocol (generation requests in, completions back to each request's reply
address), so an env actor cannot tell it from a real one.
"""

from __future__ import annotations

from typing import Callable

import trio

from streams.endpoints import Inbox, Outbox
from streams.messages import Completion, GenerationRequest
from streams.wire import Kind


async def serve_scripted(transport, receiver, reply: Callable[[GenerationRequest], Completion]) -> None:
    """Answer every request on ``receiver`` with ``reply(request)``, until cancelled."""
    inbox, replies = Inbox(receiver, Kind.GENERATE, GenerationRequest.from_body), {}
    async with trio.open_nursery() as nursery:
        while True:
            request = await inbox.receive()
            if request.reply_to not in replies:
                sender = await nursery.start(_open_sender, transport, request.reply_to)
                replies[request.reply_to] = Outbox(sender, Kind.COMPLETION, "scripted")
            await replies[request.reply_to].send(reply(request).to_body())


async def _open_sender(transport, address, task_status=trio.TASK_STATUS_IGNORED):
    async with transport.open_sender([address], capacity=4096) as sender:
        task_status.started(sender)
        await trio.sleep_forever()
