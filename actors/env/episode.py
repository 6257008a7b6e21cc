"""One episode, played: a free async function of a game, its seats and a policy, with no actor around it.

Any environment ``envs.make`` knows: n-player turn-based games, and single-agent multi-turn tasks (GEM's
interface) seated as one-player games. A seat is a policy (a learning member or a frozen snapshot of one,
whose moves are generated) or a fixed opponent's name (``envs.registry.OPPONENTS``, played by rules). A step
may be a coroutine (a slow tool): the episode waits, the others an actor hosts go on. Invalid actions cost a
penalty, a retry, then a forfeit (``envs.invalid``), all counted. An environment that raises loses its episode
only: it is logged with its traceback, counted as errored, and ``play_episode`` returns None.

An episode whose first turns fell behind the staleness bound plays on: its later turns are sampled with the
newest weights, and the learner drops only the turns too old to train. Only the seats of the episode's
``learner`` get rows (what is trained on); the other seats only play.

A turn's prompt is rendered as ``settings.prompt`` says (``actors.models.chat``: the model's chat template or raw
text, the game's history as the last observation, a transcript or chat turns), tokenized once, here: its ids
travel to the rollout actor and to the learner as they are. A turn whose prompt and token budget would not fit
``max_context_tokens`` is not asked: the episode ends there as truncated (counted), never an error.

The policy is any ``async (prompt_ids, max_tokens, policy) -> Completion``: ``actors.env.policy_client.PolicyClient``
in an env actor, a scripted function in a test.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

import trio

from actors.env.policy_client import CompletionLost, GenerationRefused
from actors.models.chat import PromptFormat, PromptRenderer
from envs.answers import read_answer, reads_boxes, unreadable_reason
from envs.base import StepResult
from envs.registry import OPPONENTS, make_opponent
from streams.messages import Completion
from streams.schema import Columns

log = logging.getLogger(__name__)
FIXED_MOVES_PER_CHECKPOINT = 8  # moves of fixed players (no await of their own) between yields

# asked for a move: (prompt token ids, the turn's token budget, the seat's policy) -> its completion
Policy = Callable[[list[int], int, str], Awaitable[Completion]]


def matchup(seats: list[str], task_type: str = "") -> str:
    """An episode's ``matchup`` column, the learner's baseline partition with the row's role: who sat where
    (``main,random``), and the type of task where the game draws one for the episode (its ``task_type``;
    ``main,main/a+b``), as Absolute Zero keeps a baseline per task type and role."""
    if not isinstance(task_type, str):
        raise TypeError(f"a game's task_type must be a str, not {type(task_type).__name__}")
    return ",".join(seats) + (f"/{task_type}" if task_type else "")


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


class EpisodeCounts:
    """Counts summed over every episode one host plays (its ``statistics()``), each seat's summed return, and
    the pace of fixed players: their moves never await, so every ``FIXED_MOVES_PER_CHECKPOINT`` of them (over
    all the host's episodes) yield once, and a host of rules-only games still lets its other tasks run.

    ``invalid_actions`` counts every invalid move, the policy's unreadable completions included (no answer in the
    answer form, ``envs.answers``); ``unreadable_actions`` counts those apart."""

    NAMES = ("episodes", "steps", "turns", "invalid_actions", "unreadable_actions", "forfeits", "errored",
             "truncated_actions", "truncated_prompts", "refused_generations", "lost_completions",
             "context_full_episodes")

    def __init__(self, num_players: int):
        self.counts = dict.fromkeys(self.NAMES, 0)
        self.return_sums = [0.0] * num_players
        self.by_role: dict[str, list[int]] = {}  # role -> [turns, invalid moves] of the policy's seats
        self._fixed_moves = 0

    async def fixed_move_played(self) -> None:
        self._fixed_moves += 1
        if not self._fixed_moves % FIXED_MOVES_PER_CHECKPOINT:  # rules alone still let the others run
            await trio.lowlevel.checkpoint()

    def finished(self, returns: list[float]) -> None:
        self.counts["episodes"] += 1
        for seat, r in enumerate(returns):
            self.return_sums[seat] += r

    def statistics(self) -> dict:
        episodes = max(self.counts["episodes"], 1)
        return {**self.counts,
                **{f"mean_return_seat{seat}": total / episodes for seat, total in enumerate(self.return_sums)},
                "turns_by_role": {role: counts[0] for role, counts in self.by_role.items()},
                "invalid_by_role": {role: counts[1] for role, counts in self.by_role.items()}}


async def play_episode(game, seats: list[str], policy: Policy, codec, settings: EpisodeSettings, *,
                       episode_id: str, seed: int, learner: str | None = None,
                       counts: EpisodeCounts | None = None) -> tuple[list[dict], list[float]] | None:
    """One episode of ``game`` (reset here with ``seed``): the agent-turn rows of ``learner``'s seats and
    every seat's return. ``codec`` turns prompts into token ids and actions back into text (``TokenCodec``).

    None: the environment raised, the rollout actor refused a generation, or a move's completion was lost
    (``CompletionLost``); the game should not be reused.
    """
    counts = counts if counts is not None else EpisodeCounts(game.num_players)
    try:
        return await _play(game, seats, _Turns(policy, codec, settings, counts), episode_id, seed, learner)
    except CompletionLost as lost:
        log.warning("episode %s dropped: %s", episode_id, lost)
        counts.counts["errored"] += 1
        counts.counts["lost_completions"] += 1
        return None
    except GenerationRefused as refused:
        log.warning("episode %s dropped: %s", episode_id, refused)
        counts.counts["errored"] += 1
        counts.counts["refused_generations"] += 1
        return None
    except Exception:  # the environment's (or an opponent's) bug costs this episode only
        log.exception("environment %s raised in episode %s; the episode is dropped", settings.env_name, episode_id)
        counts.counts["errored"] += 1
        return None


async def _play(game, seats: list[str], turns: _Turns, episode_id: str, seed: int,
                learner: str | None) -> tuple[list[dict], list[float]]:
    game.reset(seed)
    fixed = [make_opponent(name, seed=seed + s) if name in OPPONENTS else None for s, name in enumerate(seats)]
    episode = turns.episode_columns(game, episode_id, seats, seed, learner) if None in fixed else None  # rows share it
    credit = RewardCredit(game.num_players)
    if getattr(game, "simultaneous_players", None) is None:  # no move is asked ahead: no nursery to open
        result = await _turns(game, seats, turns, fixed, episode, credit, learner, None)
    else:
        failure = None
        async with trio.open_nursery() as nursery:  # for moves asked ahead (``_Asked``)
            try:
                result = await _turns(game, seats, turns, fixed, episode, credit, learner, nursery)
            except Exception as error:  # raised as itself, not inside the nursery's exception group
                failure = error
            finally:
                nursery.cancel_scope.cancel()  # moves asked for seats the episode ended before
        if failure is not None:
            raise failure
    credit.finish(result)
    turns.counts.finished(credit.returns)
    return credit.rows, credit.returns


async def _turns(game, seats: list[str], turns: _Turns, fixed: list, episode: dict | None, credit: RewardCredit,
                 learner: str | None, nursery: trio.Nursery | None) -> StepResult:
    """The episode's moves until it ends; its last step's result. ``nursery``: where moves asked ahead run (None
    for a game without ``simultaneous_players``)."""
    roles = getattr(game, "roles", None)  # seat -> role, where the game names roles
    simultaneous = getattr(game, "simultaneous_players", None)
    asked: dict[int, _Asked] = {}  # seats whose move was asked together with the current one's
    history: dict[int, list[tuple[str, str]]] = {}  # seat -> its (observation, completion text) turns so far
    for turn in itertools.count():
        seat = game.current_player
        player = fixed[seat]
        if player is None:
            row = {**episode, Columns.TURN: turn, Columns.AGENT: seat, Columns.ROLE: roles[seat] if roles else ""}
            try:
                if seat in asked:
                    move = await asked.pop(seat).wait()
                else:
                    for other in simultaneous() if simultaneous else ():  # moves that see nothing of each other
                        if other != seat and fixed[other] is None and other not in asked:
                            asked[other] = _Asked(nursery, turns, game, other, seats[other], history, roles)
                    move = await turns.ask(game, seat, seats[seat], history, roles)
            except ContextFull:  # the turn would not fit the model's context: the episode ends here, truncated
                turns.counts.counts["context_full_episodes"] += 1
                return StepResult([0.0] * game.num_players, terminated=False, truncated=True,
                                  info={"context_full": True})
            result = await turns.play(game, {**row, **move}, credit, seats[seat] == learner)
        else:
            result = await _step(game, player.act(game), credit)
            await turns.counts.fixed_move_played()
        turns.counts.counts["steps"] += 1
        if result.terminated or result.truncated:
            return result


class _Turns:
    """The policy's turns of an episode: its prompt encoded, its move asked, the row written and counted."""

    def __init__(self, policy: Policy, codec, settings: EpisodeSettings, counts: EpisodeCounts):
        self.policy, self.codec, self.settings, self.counts = policy, codec, settings, counts
        self.prompts = PromptRenderer(settings.prompt, codec, getattr(codec, "tokenizer", None))

    def episode_columns(self, game, episode_id: str, seats: list[str], seed: int, learner: str | None) -> dict:
        """What every row of an episode shares."""
        return {
            Columns.EPISODE_ID: episode_id, Columns.ENV_NAME: self.settings.env_name,
            Columns.SEED: seed, Columns.POLICY_ID: learner, Columns.CREATED_AT: time.time(),
            Columns.MATCHUP: matchup(seats, getattr(game, "task_type", "")),
        }

    async def ask(self, game, seat: int, policy: str, history: dict[int, list[tuple[str, str]]],
                  roles: list[str] | None = None) -> dict:
        """``policy``'s move in ``seat``, asked (the turn's columns of a row); the seat's ``history`` grows by it.
        ContextFull: the turn would not fit the model's context."""
        observation, earlier = game.observation(seat), history.setdefault(seat, [])
        prompt_ids = self.prompts.ids(observation, earlier, roles[seat] if roles else "")
        move = await self.policy_turn(prompt_ids, {}, getattr(game, "max_tokens", None), policy)
        earlier.append((observation, move[Columns.ACTION_TEXT]))
        return move

    async def play(self, game, row: dict, credit: RewardCredit, trained: bool) -> StepResult:
        """A move asked (``row``), played; its row is added to ``credit`` when ``trained`` (the learner's seats),
        else it only plays."""
        if trained:
            credit.add_row(row)
        settings = self.settings
        answer = read_answer(row[Columns.ACTION_TEXT], settings.answer, boxes=reads_boxes(settings.env_name))
        if answer is None:  # no answer in the form: an invalid move, counted apart, and the format penalty
            self.counts.counts["unreadable_actions"] += 1
            result = await _unreadable(game, row, credit, settings, trained)
        else:
            result = await _step(game, answer, credit)
        if trained and settings.truncation_penalty and row[Columns.ACTION_TRUNCATED]:  # cut at its token budget
            credit.add_rewards(_to_mover(settings.truncation_penalty, row, len(result.rewards)))
        row[Columns.INVALID_ACTION] = result.invalid
        self.counts.counts["invalid_actions"] += result.invalid
        if row.get(Columns.ROLE):  # per role, where the game names them: turns and invalid moves
            role = row[Columns.ROLE]
            self.counts.by_role.setdefault(role, [0, 0])
            self.counts.by_role[role][0] += 1
            self.counts.by_role[role][1] += result.invalid
        self.counts.counts["forfeits"] += "forfeit" in result.info
        return result

    async def policy_turn(self, prompt_ids: list[int], row: dict, max_tokens: int | None, policy: str) -> dict:
        """Ask the policy for a move (``prompt_ids``: the rendered prompt); ``row`` holds the episode's and the
        turn's columns so far. ContextFull: the prompt and the turn's budget do not fit the model's context."""
        limit = self.settings.max_prompt_tokens
        if limit and len(prompt_ids) > limit:
            prompt_ids = prompt_ids[-limit:]
            self.counts.counts["truncated_prompts"] += 1
        budget = max_tokens or self.settings.max_new_tokens
        context = self.settings.max_context_tokens
        if context and len(prompt_ids) + budget > context:
            raise ContextFull(f"a prompt of {len(prompt_ids)} tokens and {budget} new ones exceed "
                              f"max_context_tokens={context}")
        completion = await self.policy(prompt_ids, budget, policy)
        self.counts.counts["turns"] += 1
        self.counts.counts["truncated_actions"] += not completion.finished
        return {
            **row, Columns.PROMPT_IDS: prompt_ids, Columns.ACTION_IDS: completion.token_ids,
            Columns.ACTION_TEXT: self.codec.decode(completion.token_ids),
            Columns.BEHAVIOUR_LOGPROBS: completion.logprobs, Columns.POLICY_VERSIONS: completion.versions,
            Columns.REWARD: 0.0, Columns.TERMINATED: False, Columns.TRUNCATED: False,
            Columns.EPISODE_RETURN: 0.0, Columns.INVALID_ACTION: False,
            Columns.GENERATED_AT: time.time(), Columns.SCORED_AT: 0.0,
            Columns.ACTION_TRUNCATED: not completion.finished,
        }


def move_token_budget(game, codec, configured: int) -> int:
    """Tokens a turn may generate: ``configured``, raised (with a log line) to fit the game's longest move and
    EOS when the game lists its moves (``action_vocabulary()``), so that no legal move is cut off as invalid."""
    vocabulary = getattr(game, "action_vocabulary", None)
    if vocabulary is None:
        return configured
    longest = max(vocabulary(), key=lambda action: len(codec.encode(action)), default="")
    needed = len(codec.encode(longest)) + 1  # and EOS
    if needed > configured:
        log.info("max_new_tokens=%d leaves no room for %s's longest move %r (%d tokens and EOS): generating up to %d",
                 configured, getattr(game, "name", "the game"), longest, needed - 1, needed)
    return max(configured, needed)


async def _step(game, action: str, credit: RewardCredit) -> StepResult:
    """Play ``action``; a coroutine step (a tool that waits) is awaited. Its rewards go to ``credit``."""
    result = game.step(action)
    if not isinstance(result, StepResult):
        result = await result
    credit.add_rewards(result.rewards)
    return result


def _to_mover(reward: float, row: dict, seats: int) -> list[float]:
    return [reward if seat == row[Columns.AGENT] else 0.0 for seat in range(seats)]


async def _unreadable(game, row: dict, credit: RewardCredit, settings: EpisodeSettings,
                      trained: bool = True) -> StepResult:
    """A completion with no answer in it: an invalid move the game never sees (``InvalidActions.unreadable``:
    retries, then the forfeit), and ``format_penalty`` to the mover. A game outside ``envs.make``'s invalid rules
    has no ``unreadable``: it reads the completion as written."""
    unreadable = getattr(game, "unreadable", None)
    if unreadable is None:
        result = await _step(game, row[Columns.ACTION_TEXT], credit)
    else:
        result = unreadable(row[Columns.ACTION_TEXT], unreadable_reason(settings.answer))
        credit.add_rewards(result.rewards)
    if settings.format_penalty and trained:  # the learner's seats only
        credit.add_rewards(_to_mover(settings.format_penalty, row, len(result.rewards)))
    return result


class ContextFull(Exception):
    """A turn whose prompt and token budget would not fit the model's context: its episode ends, truncated."""


class _Asked:
    """A seat's move asked ahead, beside the current seat's (the game's ``simultaneous_players``: seats whose
    observations do not depend on each other's moves now, such as k solvers of one task): waited for on its turn."""

    def __init__(self, nursery: trio.Nursery, turns: _Turns, game, seat: int, policy: str, history: dict,
                 roles: list[str] | None):
        self._done, self._move, self._error = trio.Event(), None, None
        nursery.start_soon(self._ask, turns, game, seat, policy, history, roles)

    async def _ask(self, turns: _Turns, game, seat: int, policy: str, history: dict, roles) -> None:
        try:
            self._move = await turns.ask(game, seat, policy, history, roles)
        except Exception as error:  # raised on its turn, where the episode handles it like any move's
            self._error = error
        finally:
            self._done.set()

    async def wait(self) -> dict:
        await self._done.wait()
        if self._error is not None:
            raise self._error
        return self._move


class RewardCredit:
    """The policy's rows of one episode, and each reward credited to the row of the seat's last action.

    A reward a seat gets before it has acted goes to its first row. ``finish`` writes every row's
    ``episode_return`` and marks each seat's last row with how the episode ended.
    """

    def __init__(self, num_players: int):
        self.rows: list[dict] = []
        self.returns = [0.0] * num_players
        self._last: dict[int, dict] = {}
        self._pending = [0.0] * num_players

    def add_row(self, row: dict) -> None:
        seat = row[Columns.AGENT]
        row[Columns.REWARD] = self._pending[seat]
        self._pending[seat] = 0.0
        self._last[seat] = row
        self.rows.append(row)

    def add_rewards(self, rewards: list[float]) -> None:
        for seat, reward in enumerate(rewards):
            self.returns[seat] += reward
            if seat in self._last:
                self._last[seat][Columns.REWARD] += reward
            else:
                self._pending[seat] += reward

    def finish(self, result) -> None:
        for row in self.rows:
            row[Columns.EPISODE_RETURN] = self.returns[row[Columns.AGENT]]
        for row in self._last.values():
            row[Columns.TERMINATED], row[Columns.TRUNCATED] = result.terminated, result.truncated
