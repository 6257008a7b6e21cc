"""A lane group: the episodes of one env host, stepped together by one task, each in a lane of its own.

Each tick the group takes every answer that came since the last (completions, coroutine steps that resolved, new
episodes), decodes the completions in one call, plays each lane's move in a plain loop (fixed players' moves
after it, up to ``FIXED_MOVES_PER_CHECKPOINT`` a lane a tick), and asks the policy for every seat that now waits
for a move: the requests of a tick go out together (``PolicyClient.post``, gathered into frames). A move is not
a task switch and not an awaited future: its row goes into its episode's columns (``actors.env.columns``), and
a finished episode's columns become its Arrow table directly.

What each lane keeps, as one episode in its own task did before:
- an environment that raises (or an opponent, or the policy's answer: a refused generation, a lost completion)
  ends its lane's episode only, logged and counted as errored; ``play`` returns None for it;
- a coroutine step (a slow tool) is awaited in a task of its own: its lane leaves the lockstep and rejoins when
  the step resolves, the others go on;
- the seats of a game's ``simultaneous_players`` are asked in the same tick as the current seat, and each is
  played on its turn;
- a turn whose prompt and token budget would not fit ``max_context_tokens`` ends its episode, truncated.

``start`` is how an episode enters the group, with what to call when it ends (``ended``, on the group's tick: the
env actor's training and evaluation go on from there, with no task of their own an episode); ``play`` starts one
and waits for its end. Admission, episode ids and delivery stay with the caller, once an episode.
"""

from __future__ import annotations

import contextlib
import logging
import time
import weakref
from dataclasses import dataclass
from typing import Callable

import trio

from actors.env.columns import EpisodeColumns
from actors.env.policy_client import Answers, CompletionLost, GenerationRefused
from actors.models.chat import PromptFormat, PromptRenderer
from envs.answers import read_answer, reads_boxes, unreadable_reason
from envs.base import StepResult
from envs.registry import OPPONENTS, make_opponent
from streams.schema import Columns

log = logging.getLogger(__name__)
FIXED_MOVES_PER_CHECKPOINT = 8  # fixed players' moves a lane plays a tick: a rules-only game still lets others run
Played = tuple[EpisodeColumns, list[float]] | None  # an episode's trained rows and every seat's return; None: errored
_START, _STEPPED = -1, -2  # tokens' kinds besides a seat's completion: an episode to start, a coroutine step's result


class ContextFull(Exception):
    """A turn whose prompt and token budget would not fit the model's context: its episode ends, truncated."""


@dataclass(frozen=True)
class EpisodeSettings:
    """How an episode asks for moves and labels its rows."""

    env_name: str  # the rows' env_name
    max_new_tokens: int  # a turn's token budget when the game names none (see ``move_token_budget``)
    max_prompt_tokens: int | None = None  # keep only the last this many prompt tokens (raw prompts)
    prompt: PromptFormat = PromptFormat()  # how a turn's prompt is rendered (``actors.models.chat``)
    max_context_tokens: int | None = None  # a turn's prompt and token budget must fit: else the episode ends
    answer: str = "first_bracket"  # where the policy's move is in its completion (``envs.answers``)
    format_penalty: float = 0.0  # added to the mover's reward for a completion without an answer
    truncation_penalty: float = 0.0  # added to the mover's reward for a completion cut at its token budget


class _Ask:
    """A seat's move asked: its prompt and observation, and once answered, the completion and its text."""

    __slots__ = ("request_id", "prompt_ids", "observation", "completion", "text")

    def __init__(self, request_id: int, prompt_ids, observation: str):
        self.request_id, self.prompt_ids, self.observation = request_id, prompt_ids, observation
        self.completion = self.text = None


class Lane:
    """One episode in the group: its game, seats and columns, the moves asked for it, and how it ended."""

    __slots__ = ("game", "seats", "fixed", "learner", "episode_id", "seed", "columns", "history", "asked",
                 "waiting_on", "turn", "move", "roles", "simultaneous", "ended", "played", "over")

    def __init__(self, game, seats: list[str], learner: str | None, episode_id: str, seed: int, ended):
        self.game, self.seats, self.learner, self.episode_id, self.seed = game, seats, learner, episode_id, seed
        self.ended = ended  # called with ``played`` once the episode is over
        self.asked: dict[int, _Ask | ContextFull] = {}  # seat -> its move asked (or the turn that would not fit)
        self.history: dict[int, list[tuple[str, str]]] = {}  # seat -> its (observation, completion text) turns
        self.waiting_on: int | None = None  # the seat whose completion the lane waits for
        self.turn = 0
        self.move: tuple | None = None  # the policy's move being stepped: (row index, seat, unreadable, finished)
        self.played, self.over = None, False


class LaneGroup:
    """Every episode of one host, one task stepping them (see the module). ``port`` asks for moves: ``post(answers,
    token, prompt_ids, max_tokens, policy) -> request id`` and ``cancel(request id)`` (``PolicyClient``)."""

    def __init__(self, port, codec, settings: EpisodeSettings, counts):
        self.port, self.codec, self.settings, self.counts = port, codec, settings, counts
        self.answers = Answers()
        self.prompts = PromptRenderer(settings.prompt, codec, getattr(codec, "tokenizer", None))
        self._histories = not settings.prompt.plain  # a prompt of the observation alone needs no earlier turns
        many = getattr(codec, "decode_batch", None)
        self._decode_many = many if many is not None else (lambda ids: [codec.decode(one) for one in ids])
        self._boxes = reads_boxes(settings.env_name)
        self._runnable: list[Lane] = []  # lanes with fixed moves left at the end of their tick
        self._traits: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # game -> (roles, simultaneous, typed)
        self._nursery: trio.Nursery | None = None

    def start(self, game, seats: list[str], *, episode_id: str, seed: int, learner: str | None,
              ended: Callable[[Played], None]) -> Lane:
        """Start an episode of ``game`` (reset with ``seed``) in a lane; ``ended`` is called on the group's tick
        with ``learner``'s trained rows (its ``EpisodeColumns``) and every seat's return, or None if it errored (the
        game should not be reused)."""
        lane = Lane(game, seats, learner, episode_id, seed, ended)
        self.answers.put((lane, _START), None)
        return lane

    async def play(self, game, seats: list[str], *, episode_id: str, seed: int,
                   learner: str | None = None) -> Played:
        """``start`` one episode and wait for its end (what ``ended`` would be called with)."""
        done = trio.Event()
        lane = self.start(game, seats, episode_id=episode_id, seed=seed, learner=learner,
                          ended=lambda played: done.set())
        try:
            await done.wait()
        finally:
            if not lane.over:  # its caller was cancelled: the lane goes with it
                self._close(lane)
        return lane.played

    async def run(self) -> None:
        """The group's loop, for ever (coroutine steps are awaited in its nursery)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            while True:
                if self._runnable:
                    await trio.lowlevel.checkpoint()
                else:
                    await self.answers.wait()  # a checkpoint at least: the tick's ends start new lanes at once
                self.tick()

    def tick(self) -> None:
        """Every answer that came, each lane's move played, and every seat now waiting asked."""
        events = self.answers.take()
        runnable, self._runnable = self._runnable, []
        completions = [value for (_, kind), value in events if kind >= 0 and not isinstance(value, Exception)]
        texts = iter(self._decode_many([c.token_ids for c in completions]) if completions else ())
        for (lane, kind), value in events:
            if kind >= 0 and not isinstance(value, Exception):
                text = next(texts)
            if lane.over:  # an answer for an episode that has ended
                continue
            try:
                if isinstance(value, Exception):
                    raise value
                if kind == _START:
                    self._start(lane)
                elif kind == _STEPPED:
                    if self._stepped(lane, value):
                        continue
                else:
                    ask = lane.asked[kind]
                    ask.completion, ask.text = value, text
                    if lane.waiting_on != kind:  # a simultaneous seat's move, played on its turn
                        continue
                    lane.waiting_on = None
                self._advance(lane)
            except Exception as error:
                self._fail(lane, error)
        for lane in runnable:
            if not lane.over:
                try:
                    self._advance(lane)
                except Exception as error:
                    self._fail(lane, error)

    # -- a lane's moves ---------------------------------------------------------------------------------

    def _start(self, lane: Lane) -> None:
        game, seats, seed = lane.game, lane.seats, lane.seed
        game.reset(seed)
        lane.fixed = [make_opponent(name, seed=seed + s) if name in OPPONENTS else None for s, name in enumerate(seats)]
        lane.roles, simultaneous, typed = self._traits_of(game)
        lane.simultaneous = game.simultaneous_players if simultaneous else None
        shared = {Columns.EPISODE_ID: lane.episode_id, Columns.ENV_NAME: self.settings.env_name,
                  Columns.SEED: seed, Columns.POLICY_ID: lane.learner, Columns.CREATED_AT: time.time(),
                  Columns.MATCHUP: matchup(seats, getattr(game, "task_type", "") if typed else "")} \
            if None in lane.fixed else {}
        lane.columns = EpisodeColumns(shared, game.num_players)

    def _traits_of(self, game) -> tuple:
        """A game's roles, whether it has ``simultaneous_players`` and whether it draws a task type: what it is does not
        change between its episodes, so they are asked once a game (through an adapter's wrappers, an attribute a
        game lacks costs a chain of AttributeErrors)."""
        try:
            traits = self._traits.get(game)
        except TypeError:  # a game that cannot be a key (unhashable): asked every episode
            traits = None
        if traits is None:
            traits = (getattr(game, "roles", None), getattr(game, "simultaneous_players", None) is not None,
                      hasattr(game, "task_type"))  # no bound method kept: it would keep the game alive
            with contextlib.suppress(TypeError):
                self._traits[game] = traits
        return traits

    def _advance(self, lane: Lane) -> None:
        """Play the lane's moves until it waits for a completion or a coroutine step, or has played its fixed moves
        of the tick, or ends."""
        game, fixed_moves = lane.game, 0
        while True:
            seat = game.current_player
            player = lane.fixed[seat]
            if player is not None:
                if fixed_moves == FIXED_MOVES_PER_CHECKPOINT:
                    self._runnable.append(lane)
                    return
                fixed_moves += 1
                result = game.step(player.act(game))
            else:
                ask = lane.asked.get(seat)
                if ask is None:
                    self._ask_with_simultaneous(lane, seat)
                    ask = lane.asked[seat]
                if isinstance(ask, ContextFull):  # the turn would not fit the model's context: ends, truncated
                    self.counts.counts["context_full_episodes"] += 1
                    self._end(lane, StepResult([0.0] * game.num_players, terminated=False, truncated=True,
                                               info={"context_full": True}))
                    return
                if ask.completion is None:
                    lane.waiting_on = seat
                    return
                del lane.asked[seat]
                result = self._policy_move(lane, seat, ask)
            if not isinstance(result, StepResult):  # a coroutine step (a slow tool): the lane leaves the lockstep
                self._nursery.start_soon(self._await_step, lane, result)
                return
            if self._stepped(lane, result):
                return

    def _ask_with_simultaneous(self, lane: Lane, seat: int) -> None:
        """Ask ``seat``'s move, and those of the seats whose observations do not depend on it now."""
        if lane.simultaneous is not None:
            for other in lane.simultaneous():
                if other != seat and lane.fixed[other] is None and other not in lane.asked:
                    self._ask(lane, other)
        self._ask(lane, seat)

    def _ask(self, lane: Lane, seat: int) -> None:
        game, settings = lane.game, self.settings
        observation = game.observation(seat)
        prompt_ids = self.prompts.ids(observation, lane.history.get(seat, ()), lane.roles[seat] if lane.roles else "")
        limit = settings.max_prompt_tokens
        if limit and len(prompt_ids) > limit:
            prompt_ids = prompt_ids[-limit:]
            self.counts.counts["truncated_prompts"] += 1
        budget = getattr(game, "max_tokens", None) or settings.max_new_tokens
        context = settings.max_context_tokens
        if context and len(prompt_ids) + budget > context:
            lane.asked[seat] = ContextFull(f"a prompt of {len(prompt_ids)} tokens and {budget} new ones exceed "
                                           f"max_context_tokens={context}")
            return
        request_id = self.port.post(self.answers, (lane, seat), prompt_ids, budget, lane.seats[seat])
        lane.asked[seat] = _Ask(request_id, prompt_ids, observation)

    def _policy_move(self, lane: Lane, seat: int, ask: _Ask):
        """The policy's answer for ``seat`` played: its row (a trained seat's), and the game's step (a result, or a
        coroutine)."""
        completion, text, counts, settings = ask.completion, ask.text, self.counts.counts, self.settings
        if self._histories:
            lane.history.setdefault(seat, []).append((ask.observation, text))
        counts["turns"] += 1
        counts["truncated_actions"] += not completion.finished
        index = None
        if lane.seats[seat] == lane.learner:
            index = lane.columns.add_row(lane.turn, seat, lane.roles[seat] if lane.roles else "", ask.prompt_ids,
                                         completion, text, time.time())
        answer = read_answer(text, settings.answer, boxes=self._boxes)
        lane.move = (index, seat, answer is None, completion.finished)
        if answer is not None:
            return lane.game.step(answer)
        counts["unreadable_actions"] += 1  # no answer in the form: an invalid move, counted apart
        unreadable = getattr(lane.game, "unreadable", None)  # retries, then the forfeit (``envs.invalid``)
        if unreadable is None:  # a game outside ``envs.make``'s invalid rules reads the completion as written
            return lane.game.step(text)
        return unreadable(text, unreadable_reason(settings.answer))

    def _stepped(self, lane: Lane, result: StepResult) -> bool:
        """A step's result credited and counted; True if the episode ended with it."""
        columns = lane.columns
        columns.add_rewards(result.rewards)
        if lane.move is not None:  # the policy's move
            index, seat, unreadable, finished = lane.move
            lane.move = None
            counts, settings = self.counts, self.settings
            if index is not None:  # the learner's: its penalties, and whether it was invalid
                if unreadable and settings.format_penalty:
                    columns.add_reward(seat, settings.format_penalty)
                if settings.truncation_penalty and not finished:  # cut at its token budget
                    columns.add_reward(seat, settings.truncation_penalty)
                columns.invalid[index] = result.invalid
            counts.counts["invalid_actions"] += result.invalid
            if lane.roles and lane.roles[seat]:  # per role, where the game names them: turns and invalid moves
                role = counts.by_role.setdefault(lane.roles[seat], [0, 0])
                role[0] += 1
                role[1] += result.invalid
            counts.counts["forfeits"] += "forfeit" in result.info
        self.counts.counts["steps"] += 1
        lane.turn += 1
        if result.terminated or result.truncated:
            self._end(lane, result)
            return True
        return False

    async def _await_step(self, lane: Lane, step) -> None:
        try:
            result = await step
        except Exception as error:  # the lane's own failure, handled on its tick
            result = error
        self.answers.put((lane, _STEPPED), result)

    # -- a lane's end -----------------------------------------------------------------------------------

    def _end(self, lane: Lane, result: StepResult) -> None:
        lane.columns.finish(result.terminated, result.truncated)
        self.counts.finished(lane.columns.returns)
        lane.played = (lane.columns, lane.columns.returns)
        self._close(lane)

    def _fail(self, lane: Lane, error: Exception) -> None:
        """The lane's episode is dropped: counted as errored, by its cause. An error raised once it was over (by
        its ``ended``: the caller's bug, not the episode's) is raised on, never taken for a second end."""
        if lane.over:
            raise error
        counts = self.counts.counts
        counts["errored"] += 1
        if isinstance(error, (CompletionLost, GenerationRefused)):
            log.warning("episode %s dropped: %s", lane.episode_id, error)
            counts["lost_completions" if isinstance(error, CompletionLost) else "refused_generations"] += 1
        else:  # the environment's (or an opponent's) bug costs this episode only
            log.error("environment %s raised in episode %s; the episode is dropped", self.settings.env_name,
                      lane.episode_id, exc_info=error)
        lane.played = None
        self._close(lane)

    def _close(self, lane: Lane) -> None:
        """The lane is over: its moves still asked are forgotten, and its caller woken."""
        lane.over = True
        for ask in lane.asked.values():
            if isinstance(ask, _Ask) and ask.completion is None:
                self.port.cancel(ask.request_id)
        lane.asked.clear()
        lane.ended(lane.played)


def matchup(seats: list[str], task_type: str = "") -> str:
    """An episode's ``matchup`` column, the learner's baseline partition with the row's role: who sat where
    (``main,random``), and the type of task where the game draws one for the episode (its ``task_type``;
    ``main,main/a+b``), as Absolute Zero keeps a baseline per task type and role."""
    if not isinstance(task_type, str):
        raise TypeError(f"a game's task_type must be a str, not {type(task_type).__name__}")
    return ",".join(seats) + (f"/{task_type}" if task_type else "")
