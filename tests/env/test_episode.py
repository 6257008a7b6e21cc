"""One episode played through ``play_episode`` with a scripted policy: no actor, no streams, no tokenizer."""

import re

import pytest
import trio

from actors.env.episode import FIXED_MOVES_PER_CHECKPOINT, EpisodeCounts, EpisodeSettings, move_token_budget, \
    play_episode
from actors.env.policy_client import GenerationRefused
from envs.registry import make
from streams.messages import Completion
from streams.schema import Columns


class CharCodec:
    """A fake tokenizer: one token per character, its code point."""

    hits = 0

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(map(chr, ids))


class FirstFreeCell:
    """A scripted policy: the first free cell of the board in the prompt, as version 3; keeps what it was asked."""

    def __init__(self):
        self.asked: list[tuple[str, int, str]] = []

    async def __call__(self, prompt_ids: list[int], max_tokens: int, policy: str) -> Completion:
        prompt = CharCodec().decode(prompt_ids)
        self.asked.append((prompt, max_tokens, policy))
        board = prompt.split("\n", 1)[1]
        tokens = CharCodec().encode(f"[{re.search(r'[1-9]', board).group()}]")
        return Completion(len(self.asked), tokens, [-0.25] * len(tokens), [3] * len(tokens), True)


def play(seats, policy, learner="main", game=None, counts=None, max_prompt_tokens=None):
    game = game or make("tictactoe")
    settings = EpisodeSettings("tictactoe", max_new_tokens=6, max_prompt_tokens=max_prompt_tokens)
    return trio.run(lambda: play_episode(game, seats, policy, CharCodec(), settings, episode_id="e-0", seed=7,
                                         learner=learner, counts=counts))


def test_a_mirror_game_gives_every_turn_a_row_and_credits_each_seats_last_move():
    """X and O both take the first free cell: X holds 1, 3, 5 and 7 and wins on the seventh move."""
    counts = EpisodeCounts(2)
    rows, returns = play(["main", "main"], FirstFreeCell(), counts=counts)
    assert returns == [1.0, -1.0]
    assert [r[Columns.AGENT] for r in rows] == [0, 1, 0, 1, 0, 1, 0]
    assert [r[Columns.ACTION_TEXT] for r in rows] == [f"[{n}]" for n in range(1, 8)]
    assert [r[Columns.REWARD] for r in rows] == [0, 0, 0, 0, 0, -1.0, 1.0]  # O's loss on its last move
    assert [r[Columns.TERMINATED] for r in rows] == [False] * 5 + [True, True]
    assert [r[Columns.EPISODE_RETURN] for r in rows] == [1.0, -1.0] * 3 + [1.0]
    assert {r[Columns.EPISODE_ID] for r in rows} == {"e-0"} and {r[Columns.MATCHUP] for r in rows} == {"main,main"}
    assert all(r[Columns.POLICY_VERSIONS] == [3, 3, 3] and r[Columns.POLICY_ID] == "main" for r in rows)
    assert counts.counts["episodes"] == 1 and counts.counts["steps"] == 7 and counts.counts["turns"] == 7
    assert counts.statistics()["mean_return_seat0"] == 1.0


def test_only_the_learners_seats_have_rows_and_a_fixed_opponent_asks_no_policy():
    policy = FirstFreeCell()
    rows, returns = play(["random", "main"], policy)
    assert rows and {r[Columns.AGENT] for r in rows} == {1}
    assert [policy_name for _, _, policy_name in policy.asked] == ["main"] * len(rows)
    assert sum(r[Columns.REWARD] for r in rows) == returns[1] and sum(returns) == 0.0
    assert all(budget == 6 for _, budget, _ in policy.asked)  # the game names no budget: the settings' one


def test_a_long_prompt_keeps_its_last_tokens():
    counts, policy = EpisodeCounts(2), FirstFreeCell()
    rows, _ = play(["main", "random"], policy, counts=counts, max_prompt_tokens=24)  # the board and "Move:"
    assert all(len(r[Columns.PROMPT_IDS]) == 24 for r in rows)
    assert counts.counts["truncated_prompts"] == len(rows)


def test_a_refused_generation_drops_the_episode_and_is_counted():
    async def refusing(prompt_ids, max_tokens, policy):
        raise GenerationRefused("temperature must be in [0, 2]")

    counts = EpisodeCounts(2)
    assert play(["main", "main"], refusing, counts=counts) is None
    assert counts.counts["errored"] == 1 and counts.counts["refused_generations"] == 1
    assert counts.counts["episodes"] == 0


def test_fixed_players_alone_yield_every_few_moves():
    """A rules-only game never awaits: it still checkpoints, so a host's other tasks run between its moves."""
    counts, ticks = EpisodeCounts(2), []

    async def main():
        async with trio.open_nursery() as nursery:
            async def ticker():
                while True:
                    ticks.append(counts.counts["steps"])
                    await trio.lowlevel.checkpoint()

            nursery.start_soon(ticker)
            await trio.lowlevel.checkpoint()
            for seed in range(12):
                await play_episode(make("tictactoe"), ["minimax", "random"], None, CharCodec(),
                                   EpisodeSettings("tictactoe", 6), episode_id=f"e-{seed}", seed=seed, counts=counts)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert counts.counts["turns"] == 0 and counts.counts["steps"] >= 12 * 5
    # trio runs the two in either order in each round, so the ticker sees the count before or after each stretch of
    # moves: at least half the yields show as distinct counts (a game that never yields would show one or two)
    yields = counts.counts["steps"] // FIXED_MOVES_PER_CHECKPOINT
    assert yields >= 7 and len(set(ticks)) >= yields // 2


def test_the_token_budget_fits_the_longest_move():
    game = make("tictactoe")
    assert move_token_budget(game, CharCodec(), 2) == 4  # "[9]" and EOS
    assert move_token_budget(game, CharCodec(), 8) == 8


@pytest.mark.parametrize("seats", [["main", "main"], ["random", "main"]])
def test_a_finished_game_can_be_played_again(seats):
    game = make("tictactoe")
    first, again = play(seats, FirstFreeCell(), game=game), play(seats, FirstFreeCell(), game=game)
    assert first[1] == again[1] and len(first[0]) == len(again[0])  # reset with the same seed: the same game


class Quorum:
    """A game of roles: seat 0 names a number, then seats 1..k each guess it, seeing only the question; the
    guessers' moves do not depend on each other (``simultaneous_players``). Rewards at the end."""

    name, num_players = "quorum", 4
    roles = ["asker", "guesser", "guesser", "guesser"]

    def reset(self, seed: int) -> None:
        self.moves: list[str] = []

    @property
    def current_player(self) -> int:
        return len(self.moves)

    def simultaneous_players(self) -> list[int]:
        return list(range(len(self.moves), 4)) if self.moves else []

    def observation(self, player: int) -> str:
        return "ask" if player == 0 else f"guess {player}"

    def step(self, action_text: str):
        from envs.base import StepResult

        self.moves.append(action_text)
        done = len(self.moves) == 4
        right = sum(m == self.moves[0] for m in self.moves[1:])
        return StepResult(rewards=[float(right), *[float(m == self.moves[0]) for m in self.moves[1:]], 0.0, 0.0][:4]
                          if done else [0.0] * 4, terminated=done)

    def legal_actions(self) -> list[str]:
        return []


def test_roles_are_written_on_rows_and_simultaneous_seats_are_asked_together():
    """The three guessers' moves are asked at once (all three asks in flight before any answer), and each row
    carries its seat's role."""

    class Gate:
        def __init__(self):
            self.waiting, self.opened, self.most = 0, trio.Event(), 0

        async def __call__(self, prompt_ids, max_tokens, policy):
            prompt = CharCodec().decode(prompt_ids)
            if prompt.startswith("guess"):
                self.waiting += 1
                self.most = max(self.most, self.waiting)
                if self.waiting == 3:
                    self.opened.set()
                await self.opened.wait()  # no guess is answered before all three were asked
            text = "[7]" if prompt == "ask" or prompt == "guess 2" else "[1]"
            tokens = CharCodec().encode(text)
            return Completion(1, tokens, [-0.5] * len(tokens), [0] * len(tokens), True)

    gate, counts = Gate(), EpisodeCounts(4)
    rows, returns = play(["main"] * 4, gate, game=Quorum(), counts=counts)
    assert gate.most == 3
    stats = counts.statistics()
    assert stats["turns_by_role"] == {"asker": 1, "guesser": 3} and stats["invalid_by_role"] == {"asker": 0, "guesser": 0}
    assert [r[Columns.ROLE] for r in rows] == ["asker", "guesser", "guesser", "guesser"]
    assert [r[Columns.AGENT] for r in rows] == [0, 1, 2, 3] and [r[Columns.ACTION_TEXT] for r in rows][:3] == \
        ["[7]", "[1]", "[7]"]


def test_the_matchup_names_the_seats_and_a_drawn_task_type():
    from actors.env.episode import matchup

    assert matchup(["main", "random"]) == "main,random" and matchup(["main"] * 2, "a+b") == "main,main/a+b"
    with pytest.raises(TypeError, match="task_type must be a str, not int"):
        matchup(["main"], 3)
