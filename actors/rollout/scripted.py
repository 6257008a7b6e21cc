"""A scripted rollout: answers generation requests by a rule instead of a model (tests and benchmarks).

It speaks the rollout actor's protocol (generation requests in, completions back to each request's reply
address, a batch of them a frame), so an env actor cannot tell it from a real one.
"""

from __future__ import annotations

from typing import Callable

import trio

from streams.endpoints import Inbox, Outbox
from streams.messages import Completion, GenerationRequest, decode_requests, encode_completions, split_completions
from streams.wire import Kind


async def serve_scripted(transport, receiver, reply: Callable[[GenerationRequest], Completion]) -> None:
    """Answer every request on ``receiver`` with ``reply(request)``, until cancelled: a frame of requests with a
    frame of completions to each address they name."""
    inbox, replies = Inbox(receiver, Kind.GENERATE, decode_requests), {}
    async with trio.open_nursery() as nursery:
        while True:
            answers: dict[str, list[Completion]] = {}
            for request in await inbox.receive():
                answers.setdefault(request.reply_to, []).append(reply(request))
            for address, completions in answers.items():
                if address not in replies:
                    sender = await nursery.start(_open_sender, transport, address)
                    replies[address] = Outbox(sender, Kind.COMPLETION, "scripted")
                for batch in split_completions(completions):
                    await replies[address].send(encode_completions(batch))


async def _open_sender(transport, address, task_status=trio.TASK_STATUS_IGNORED):
    async with transport.open_sender([address], capacity=4096) as sender:
        task_status.started(sender)
        await trio.sleep_forever()
