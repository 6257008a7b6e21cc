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

An env actor plays its episodes in a lane group (``actors.env.lanes``: one task steps them all, asking the
``PolicyClient`` for every waiting seat's move at once); ``play_episode`` plays one episode in a group of its own,
its moves asked of any ``async (prompt_ids, max_tokens, policy) -> Completion`` (a scripted function in a test),
and gives its rows one by one.
"""

from __future__ import annotations

import itertools
import logging

import trio

from actors.env.lanes import FIXED_MOVES_PER_CHECKPOINT, ContextFull, EpisodeSettings, LaneGroup, matchup  # noqa: F401

log = logging.getLogger(__name__)


class EpisodeCounts:
    """Counts summed over every episode one host plays (its ``statistics()``), and each seat's summed return.

    ``invalid_actions`` counts every invalid move, the policy's unreadable completions included (no answer in the
    answer form, ``envs.answers``); ``unreadable_actions`` counts those apart."""

    NAMES = ("episodes", "steps", "turns", "invalid_actions", "unreadable_actions", "forfeits", "errored",
             "truncated_actions", "truncated_prompts", "refused_generations", "lost_completions",
             "context_full_episodes")

    def __init__(self, num_players: int):
        self.counts = dict.fromkeys(self.NAMES, 0)
        self.return_sums = [0.0] * num_players
        self.by_role: dict[str, list[int]] = {}  # role -> [turns, invalid moves] of the policy's seats

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


async def play_episode(game, seats: list[str], policy, codec, settings: EpisodeSettings, *,
                       episode_id: str, seed: int, learner: str | None = None,
                       counts: EpisodeCounts | None = None) -> tuple[list[dict], list[float]] | None:
    """One episode of ``game`` (reset here with ``seed``) in a lane group of its own: the agent-turn rows of
    ``learner``'s seats and every seat's return. ``policy`` answers each move (``async (prompt_ids, max_tokens,
    policy) -> Completion``); ``codec`` turns prompts into token ids and actions back into text (``TokenCodec``).

    None: the environment raised, the policy refused a generation, or a move's completion was lost
    (``CompletionLost``); the game should not be reused.
    """
    counts = counts if counts is not None else EpisodeCounts(game.num_players)
    async with trio.open_nursery() as nursery:
        group = LaneGroup(_Calls(policy, nursery), codec, settings, counts)
        nursery.start_soon(group.run)
        played = await group.play(game, seats, episode_id=episode_id, seed=seed, learner=learner)
        nursery.cancel_scope.cancel()
    return (played[0].rows(), played[1]) if played is not None else None


class _Calls:
    """A policy function as a lane group's port: each move asked is a call of its own, answered into the group."""

    def __init__(self, policy, nursery: trio.Nursery):
        self._policy, self._nursery, self._ids, self._cancelled = policy, nursery, itertools.count(), set()

    def post(self, answers, token, prompt_ids: list[int], max_tokens: int, policy: str) -> int:
        request_id = next(self._ids)
        self._nursery.start_soon(self._call, answers, token, request_id, prompt_ids, max_tokens, policy)
        return request_id

    def cancel(self, request_id: int) -> None:
        self._cancelled.add(request_id)

    async def _call(self, answers, token, request_id: int, prompt_ids, max_tokens: int, policy: str) -> None:
        try:
            value = await self._policy(prompt_ids, max_tokens, policy)
        except Exception as error:  # the move's failure: its episode's, on its tick
            value = error
        if request_id not in self._cancelled:
            answers.put(token, value)


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
