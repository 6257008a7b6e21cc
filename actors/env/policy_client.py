"""Asking rollout actors for moves: a ``PolicyClient`` sends generation requests and routes the answers back.

Each policy is served by its rollout group: a learning member's own group, and a snapshot ``<member>-v<n>`` by
its member's group. Every request for a live member carries the learner version the env actor knows of as
``min_version``: the rollout actor waits for those weights rather than sample with older ones, so with
max_staleness = 0 training is exactly on-policy. A snapshot's weights are frozen: any version serves it.

Requests go out in batches (``streams.generation_messages``): those the actor's episodes ask while the previous
frame to a group is being sent wait together, and go in the next, so a thousand episodes cost a few frames a round,
not a thousand; completions come back likewise.

Request ids of a restarted env actor (``incarnation`` > 0) start apart from its predecessor's, so an answer to
a dead actor's request is dropped here as a stray. A request stays in the waiting map until it is answered;
``reissue`` sends every unanswered one again (a rollout actor died with some of them, and only it knew which),
and an answer that comes twice counts once.

A completion can also be lost on its way back (the rollout's replies drop one they could not deliver in time:
``streams.replies``), and nobody would ever say so. So each request has a deadline (``request_deadline_s``):
unanswered by then it is sent once more, and unanswered a second deadline later its episode is dropped
(``CompletionLost``) and gives its admission back, rather than wait, and hold its place in the staleness bound,
for ever.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
from typing import AsyncIterator, Callable

import trio

from actors.models.snapshots import parse_snapshot_id
from streams.endpoints import Inbox, Outbox, open_outboxes
from streams.messages import (Completion, GenerationRequest, Packed, decode_completions, encode_requests, packed_bytes,
                             split_requests)
from streams.wire import FRAME_LIMITS, Kind, MAX_NEW_TOKENS

GATHER_ROUNDS = 8  # scheduler rounds a frame of requests waits at most for more, while more keep coming
REQUEST_DEADLINE_S = 120.0  # a request unanswered this long is sent again, once; then its episode is dropped


class GenerationRefused(Exception):
    """The rollout actor could not sample a request (e.g. vLLM refuses temperatures above 2): the episode
    that asked is dropped, with the reason in the log, and counted as errored."""


class CompletionLost(Exception):
    """A request went unanswered past its deadline twice (sent, then sent again): its completion is taken as
    lost, and the episode that asked is dropped, counted (``lost_completions``) and given back."""


@contextlib.asynccontextmanager
async def open_policy_client(transport, rollouts: dict[str, list[str]], *, name: str, own: str, temperature: float,
                             min_version: Callable[[str], int], incarnation: int = 0,
                             request_deadline_s: float = REQUEST_DEADLINE_S) -> AsyncIterator[PolicyClient]:
    """A ``PolicyClient`` sending to each member's rollout group in ``rollouts`` (``own``: this actor's own
    policy), answered on a receiver of its own; its router and reissues run in its nursery until exit."""
    async with (
        transport.open_receiver(capacity=1024, max_message_bytes=FRAME_LIMITS[Kind.COMPLETION]) as completions,
        open_outboxes(transport, rollouts, Kind.GENERATE, name, capacity=1024) as requests,
        trio.open_nursery() as nursery,
    ):
        client = PolicyClient(requests, Inbox(completions, Kind.COMPLETION, decode_completions),
                              completions.address, nursery, own=own, rollouts=rollouts,
                              temperature=temperature, min_version=min_version, incarnation=incarnation,
                              request_deadline_s=request_deadline_s)
        nursery.start_soon(client.route_completions)
        nursery.start_soon(client.keep_deadlines)
        for group in requests:
            nursery.start_soon(client.send_requests, group)
        yield client
        nursery.cancel_scope.cancel()


class Answers:
    """Where answers land for whoever asked: (token, value) pairs, taken all at once (``take``), and a wake-up
    when the first lands. A lane group keeps one for every answer it waits on (``actors.env.lanes``)."""

    def __init__(self):
        self.ready: list[tuple[object, object]] = []
        self._wake = trio.Event()

    def put(self, token, value) -> None:
        self.ready.append((token, value))
        self._wake.set()

    def put_many(self, answers: list[tuple[object, object]]) -> None:
        """Several (token, value) pairs at once (a frame's completions): one wake-up."""
        self.ready.extend(answers)
        self._wake.set()

    async def wait(self) -> None:
        """Until something is ready (a checkpoint, if it is)."""
        if self.ready:
            await trio.lowlevel.checkpoint()
        else:
            await self._wake.wait()

    def take(self) -> list[tuple[object, object]]:
        ready, self.ready = self.ready, []
        if self._wake.is_set():
            self._wake = trio.Event()
        return ready


class PolicyClient:
    """Generation requests out, completions back to whoever asked (see the module): ``post`` asks and returns at
    once, and the completion (or the error: ``GenerationRefused``, ``CompletionLost``) is put in the asker's
    ``Answers`` with its token; ``generate`` asks and waits for one."""

    def __init__(self, requests: dict[str, Outbox], completions: Inbox, reply_to: str, nursery, *, own: str,
                 rollouts: dict[str, list[str]], temperature: float, min_version: Callable[[str], int],
                 incarnation: int = 0, request_deadline_s: float = REQUEST_DEADLINE_S):
        if not request_deadline_s > 0:
            raise ValueError(f"request_deadline_s must be a positive number of seconds, not {request_deadline_s}")
        self._requests, self._completions, self.reply_to, self._nursery = requests, completions, reply_to, nursery
        self._deadline_s = request_deadline_s
        self._own = own
        self._rollouts = {m: list(a) for m, a in rollouts.items()}  # each group's actors: a scale changes them
        self._temperature, self._min_version = temperature, min_version
        self._request_ids = itertools.count(incarnation << 40)  # apart from any predecessor's
        # id -> (where its answer goes, its token there, the request, its group), until answered or given up
        self._waiting: dict[int, tuple[Answers, object, GenerationRequest, str]] = {}
        # (when, id, attempt) of every request sent: in the order they fall due, as every request has one deadline
        self._deadlines: collections.deque[tuple[float, int, int]] = collections.deque()
        self._deadline_posted = trio.Event()
        self._pending: dict[str, list[tuple[GenerationRequest, bool]]] = {group: [] for group in requests}  # to send,
        self._wake = {group: trio.Event() for group in requests}  # and whether each is a reissue
        self.counts = {"reissued_requests": 0, "duplicate_completions": 0, "request_frames": 0,
                       "completion_frames": 0}

    def post(self, answers: Answers, token, prompt_ids: list[int], max_tokens: int, policy: str) -> int:
        """Ask ``policy``'s rollout group for a completion (a live member's at least at the version this actor
        knows of; a snapshot's, frozen, from its member's group at any version), answered into ``answers`` with
        ``token``; returns the request's id (``cancel`` forgets it). GenerationRefused: no rollout could take it."""
        if not prompt_ids or not 0 < max_tokens <= MAX_NEW_TOKENS:  # a frame with such a request would be refused
            raise GenerationRefused(f"no request is sent for a prompt of {len(prompt_ids)} tokens and a budget of "
                                    f"{max_tokens} new tokens (1 to {MAX_NEW_TOKENS})")  # whole: its episode drops
        snapshot = parse_snapshot_id(policy) if policy not in self._requests else None
        group = snapshot[0] if snapshot else policy
        if group not in self._requests:
            raise ValueError(f"no rollout group serves policy {policy!r} (groups: {sorted(self._requests)})")
        request_id = next(self._request_ids)
        request = GenerationRequest(request_id, self.reply_to, policy, prompt_ids, self._temperature, max_tokens,
                                    0 if snapshot else self._min_version(policy))
        self._waiting[request_id] = (answers, token, request, group)
        self._post(group, request, False)  # its deadline runs from when it is sent (``send_requests``)
        return request_id

    def cancel(self, request_id: int) -> None:
        """Forget a request: its answer, if one comes, is dropped as a stray (the episode that asked has ended)."""
        self._waiting.pop(request_id, None)

    async def generate(self, prompt_ids: list[int], max_tokens: int, policy: str) -> Completion:
        """One completion (``post``, then wait for its answer): raises what the answer is instead, if an error."""
        answers = Answers()
        request_id = self.post(answers, None, prompt_ids, max_tokens, policy)
        try:
            await answers.wait()
        finally:
            self.cancel(request_id)
        ((_, value),) = answers.take()
        if isinstance(value, Exception):
            raise value
        return value

    async def keep_deadlines(self) -> None:
        """A request unanswered past its deadline is sent again, once; unanswered a second deadline later, its
        asker is answered ``CompletionLost``."""
        deadlines = self._deadlines
        while True:
            if not deadlines:
                self._deadline_posted = trio.Event()
                await self._deadline_posted.wait()
                continue
            due, request_id, attempt = deadlines[0]
            if request_id in self._waiting:
                await trio.sleep_until(due)
            deadlines.popleft()
            waiter = self._waiting.get(request_id)
            if waiter is None:  # answered, or its asker gone
                continue
            answers, token, request, group = waiter
            if attempt == 0:  # lost on its way there or back, or only slow: once more (two answers count once)
                deadlines.append((trio.current_time() + self._deadline_s, request_id, 1))
                self._post(group, request, True)
            else:
                del self._waiting[request_id]
                answers.put(token, CompletionLost(
                    f"generation request {request_id} to {group} unanswered for twice its deadline of "
                    f"{self._deadline_s:g} s (sent again once)"))

    def _start_deadlines(self, request_ids: list[int]) -> None:
        """The first deadline of each of these requests, sent now (one clock reading for a frame's worth)."""
        if not request_ids:
            return
        if not self._deadlines:
            self._deadline_posted.set()
        due = trio.current_time() + self._deadline_s
        self._deadlines.extend([(due, request_id, 0) for request_id in request_ids])

    def _post(self, group: str, request: GenerationRequest, reissue: bool) -> None:
        pending = self._pending[group]
        if not pending:  # the first of a frame wakes its sender; the rest join it (``send_requests`` takes them all)
            self._wake[group].set()
        pending.append((request, reissue))

    async def send_requests(self, group: str) -> None:
        """Send what ``group``'s episodes asked, a few frames at a time; a request answered or given up on while it
        waited here is not sent."""
        outbox = self._requests[group]
        while True:
            await self._wake[group].wait()
            for _ in range(GATHER_ROUNDS):  # while episodes woken together keep asking, they go in this frame
                asked = len(self._pending[group])
                await trio.lowlevel.cancel_shielded_checkpoint()
                if len(self._pending[group]) == asked:
                    break
            self._wake[group] = trio.Event()
            posted, self._pending[group] = self._pending[group], []
            waiting = self._waiting
            unanswered = [(r, again) for r, again in posted if r.request_id in waiting]
            self._start_deadlines([r.request_id for r, again in unanswered if not again])
            for batch in split_requests([request for request, _ in unanswered]):
                await outbox.send(encode_requests(batch))
                self.counts["request_frames"] += 1
            self.counts["reissued_requests"] += sum(again for _, again in unanswered)

    async def route_completions(self) -> None:
        waiting = self._waiting
        while True:
            completions = await self._completions.receive()
            self.counts["completion_frames"] += 1
            landing: dict[Answers, list] = {}  # where answers go -> its answers of this frame: put at once
            for completion in completions:
                waiter = waiting.pop(completion.request_id, None)
                if waiter is None:  # a reissued request answered twice, or a stray: the first counts
                    self.counts["duplicate_completions"] += 1
                    continue
                answers, token = waiter[0], waiter[1]
                if completion.error:
                    answers.put(token, GenerationRefused(
                        f"the rollout actor refused generation request {completion.request_id}: {completion.error}"))
                    continue
                landing.setdefault(answers, []).append((token, completion))
            for answers, answered in landing.items():
                answers.put_many(answered)

    def set_rollouts(self, addresses: list[str], member: str | None = None) -> None:
        """Send ``member``'s requests (default: the own policy's) to these rollout actors from now on (a scale):
        joining ones take work at once; a leaving one is sent nothing more, and what it was sent and had not
        acknowledged is dropped here: the driver calls ``reissue`` once it is gone, and an answer that still
        comes is counted once."""
        member = member or self._own
        if member not in self._requests:
            raise ValueError(f"no rollout group of member {member!r} (groups: {sorted(self._requests)})")
        sender, before = self._requests[member].channel, self._rollouts[member]
        for address in set(before) - set(addresses):
            sender.disconnect(address)
        for address in addresses:
            if address not in before:
                sender.connect(address)
        self._rollouts[member] = list(addresses)

    def reissue(self) -> int:
        """Send again every generation request still unanswered. Returns how many go out."""
        unanswered = [(request, group) for _, _, request, group in self._waiting.values()]
        for request, group in unanswered:  # one answered (or ended) before it goes out is not sent
            self._post(group, request, True)
        return len(unanswered)

    def statistics(self) -> dict:
        completions = self._completions.statistics()
        return {**self.counts, "live_episodes": len(self._waiting), "dropped_frames": completions["dropped_frames"],
                "completions": completions}


def by_member(peers: list[str] | dict[str, list[str]], policy_id: str) -> dict[str, list[str]]:
    """Addresses per learning member: a league's map as it is, one policy's list under its id."""
    return dict(peers) if isinstance(peers, dict) else {policy_id: list(peers)}


class TokenCodec:
    """Prompts to token ids and actions to text, through the fast tokenizer's core when there is one.

    Prompts repeat (instructions, first observations, templated feedback), so their ids are cached by text
    (``cache_size`` of them, least recently used out): the same ids ``tokenizer(prompt)`` gives.
    """

    def __init__(self, tokenizer, cache_size: int = 8192):
        self.tokenizer = tokenizer  # a chat prompt is rendered with its template (``actors.models.chat``)
        core = tokenizer.backend_tokenizer if getattr(tokenizer, "is_fast", False) else None
        if core is not None:
            self._encode_new = lambda text, specials: _packed(core.encode(text, add_special_tokens=specials).ids)
            self.decode = lambda ids: core.decode(ids, skip_special_tokens=True)
            self.decode_batch = lambda many: core.decode_batch(many, skip_special_tokens=True)
        else:
            self._encode_new = lambda text, specials: _packed(tokenizer(text, add_special_tokens=specials)["input_ids"])
            self.decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)
            self.decode_batch = lambda many: [tokenizer.decode(ids, skip_special_tokens=True) for ids in many]
        self._cached = functools.lru_cache(maxsize=cache_size)(self._encode_new)

    def encode(self, text: str) -> list[int]:
        """The ids (a ``Packed`` list of its own: the caller may keep it; their bytes are made once per prompt)."""
        ids, packed = self._cached(text, True)
        return Packed.of(ids, packed)

    def encode_chat(self, text: str) -> list[int]:
        """The ids of a rendered chat template's text: no special tokens added (the template wrote its own), as
        ``apply_chat_template`` tokenizes it."""
        ids, packed = self._cached(text, False)
        return Packed.of(ids, packed)

    @property
    def hits(self) -> int:
        return self._cached.cache_info().hits


def _packed(ids: list[int]) -> tuple[tuple[int, ...], bytes]:
    return tuple(ids), packed_bytes([ids], "<i4")
