"""One episode played through ``play_episode`` with a scripted policy: no actor, no streams, no tokenizer."""

import re

import pytest
import trio

from actors.env.episode import FIXED_MOVES_PER_CHECKPOINT, EpisodeCounts, EpisodeSettings, move_token_budget, \
    play_episode
from actors.env.policy_client import GenerationRefused
from envs.answers import FORMS
from envs.registry import make
from streams.messages import Completion
from streams.schema import Columns
from tests.support.episodes import CharCodec, Quorum


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


def play(seats, policy, learner="main", game=None, counts=None, max_prompt_tokens=None, **reading):
    game = game or make("tictactoe")
    settings = EpisodeSettings("tictactoe", max_new_tokens=6, max_prompt_tokens=max_prompt_tokens, **reading)
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


# -- answer forms (``envs.answers``): only the policy's completions are read through them ---------------------

class Writes:
    """A scripted policy that writes ``write(prompt, call)`` (call counts from 0); keeps the prompts it was asked."""

    def __init__(self, write):
        self.write, self.prompts = write, []

    async def __call__(self, prompt_ids, max_tokens, policy):
        prompt = CharCodec().decode(prompt_ids)
        self.prompts.append(prompt)
        tokens = CharCodec().encode(self.write(prompt, len(self.prompts) - 1))
        return Completion(len(self.prompts), tokens, [-0.5] * len(tokens), [1] * len(tokens), True)


def first_free(prompt: str) -> str:
    return re.search(r"[1-9]", prompt.split("\n", 1)[1]).group()


IN_FORM = {  # a completion with the first free cell as its move, written in each form
    "first_bracket": lambda cell: f"I play [{cell}], not [10]",
    "last_bracket": lambda cell: f"[10] is no cell, so [{cell}]",
    "boxed": lambda cell: f"[1] is taken? so the answer is \\boxed{{{cell}}}",
    "think_first_bracket": lambda cell: f"<think>[1] or [2]</think> [{cell}]",
    "think_last_bracket": lambda cell: f"<think>[1]</think> [10] [{cell}]",
    "think_boxed": lambda cell: f"<think>\\boxed{{1}}</think> \\boxed{{{cell}}}",
}


def test_a_policy_that_boxes_its_move_plays_tictactoe_under_boxed():
    policy = Writes(lambda prompt, call: f"The first free cell, so \\boxed{{{first_free(prompt)}}}")
    counts = EpisodeCounts(2)
    rows, returns = play(["main", "main"], policy, counts=counts, answer="boxed")
    assert returns == [1.0, -1.0] and len(rows) == 7  # X takes 1, 3, 5, 7 as in the bracketed mirror game
    assert [r[Columns.ACTION_TEXT] for r in rows] == [f"The first free cell, so \\boxed{{{n}}}" for n in range(1, 8)]
    assert counts.counts["invalid_actions"] == 0 and counts.counts["unreadable_actions"] == 0
    counts = EpisodeCounts(2)  # the same completions read as brackets: none holds one, X forfeits at once
    rows, returns = play(["main", "main"], policy, counts=counts)
    assert returns == [-1.0, 0.0] and len(rows) == 1 and rows[0][Columns.INVALID_ACTION]
    assert counts.counts["unreadable_actions"] == 1 and counts.counts["invalid_actions"] == 1


def test_an_unreadable_completion_is_an_invalid_move_counted_apart_with_the_format_penalty():
    """No ``</think>``: nothing is readable, though the completion holds a legal move. With a retry the mover pays
    retry_penalty and format_penalty, and its next prompt says what was missing; without, it forfeits."""
    write = Writes(lambda prompt, call: f"[{first_free(prompt)}]" if call == 0 else f"</think> [{first_free(prompt)}]")
    counts = EpisodeCounts(2)
    rows, returns = play(["main", "random"], write, counts=counts, game=make("tictactoe", max_retries=1),
                         answer="think_last_bracket", format_penalty=-0.5)
    assert rows[0][Columns.ACTION_TEXT] == "[1]" and rows[0][Columns.INVALID_ACTION]  # as generated
    assert rows[0][Columns.REWARD] == pytest.approx(-0.1 - 0.5) and not rows[1][Columns.INVALID_ACTION]
    assert write.prompts[1].startswith("Your answer '[1]' is not a valid move: no answer found: write the move in "
                                       "square brackets after </think>. Try again")
    assert counts.counts["unreadable_actions"] == 1 and counts.counts["invalid_actions"] == 1
    assert counts.counts["forfeits"] == 0 and returns[0] == pytest.approx(sum(r[Columns.REWARD] for r in rows))

    counts = EpisodeCounts(2)
    rows, returns = play(["random", "main"], Writes(lambda prompt, call: "I play [5]"), counts=counts,
                         answer="boxed", format_penalty=-0.5)
    assert returns == pytest.approx([0.0, -1.5]) and len(rows) == 1  # invalid_penalty and format_penalty
    assert rows[0][Columns.REWARD] == pytest.approx(-1.5) and rows[0][Columns.TERMINATED]
    assert counts.counts["forfeits"] == 1 and counts.counts["unreadable_actions"] == 1


def test_an_illegal_answer_is_invalid_but_not_unreadable_and_pays_no_format_penalty():
    counts = EpisodeCounts(2)
    rows, returns = play(["main", "random"], Writes(lambda prompt, call: "\\boxed{10}"), counts=counts,
                         answer="boxed", format_penalty=-0.5)
    assert returns == [-1.0, 0.0] and rows[0][Columns.INVALID_ACTION]
    assert counts.counts["invalid_actions"] == 1 and counts.counts["unreadable_actions"] == 0


@pytest.mark.parametrize("form", FORMS)
def test_fixed_opponents_play_alike_under_every_form(form):
    """An opponent writes canonical bracketed moves, which no form but the bracket ones would read: they never go
    through the form. The policy's moves, written in the form, are read."""
    alone = [play(["minimax", "random"], None, answer=form, learner=None)[1] for _ in range(2)]
    assert alone[0] == alone[1] == play(["minimax", "random"], None, learner=None)[1]
    for seats in (["random", "main"], ["main", "minimax"]):
        counts = EpisodeCounts(2)
        rows, _ = play(seats, Writes(lambda prompt, call: IN_FORM[form](first_free(prompt))), counts=counts,
                       answer=form)
        assert counts.counts["invalid_actions"] == 0 and counts.counts["unreadable_actions"] == 0, seats
        assert counts.counts["steps"] > counts.counts["turns"] == len(rows)  # the opponent's moves were played


def test_a_game_without_the_invalid_rules_reads_an_unreadable_completion_as_written():
    """A game not made by ``envs.make`` (no ``unreadable``) gets the completion as generated; it is still counted."""
    counts = EpisodeCounts(4)
    rows, returns = play(["main"] * 4, Writes(lambda prompt, call: "[7]"), game=Quorum(), counts=counts,
                         answer="boxed")
    assert returns == [3.0, 1.0, 1.0, 1.0] and counts.counts["unreadable_actions"] == 4


def test_a_completion_cut_at_its_budget_is_marked_and_costs_the_truncation_penalty():
    """Every X move is cut (not finished): its row says so, it is counted, and truncation_penalty goes to X's rows
    (the learner's seat) only; O's finished moves are unmarked and cost nothing."""

    async def policy(prompt_ids, max_tokens, policy_id):
        prompt = CharCodec().decode(prompt_ids)
        board = prompt.split("\n", 1)[1]
        tokens = CharCodec().encode(f"[{re.search(r'[1-9]', board).group()}]")
        return Completion(0, tokens, [-0.25] * len(tokens), [3] * len(tokens), "You are O" in prompt)

    counts = EpisodeCounts(2)
    settings = EpisodeSettings("tictactoe", max_new_tokens=6, truncation_penalty=-0.1)
    rows, returns = trio.run(lambda: play_episode(make("tictactoe"), ["main", "main"], policy, CharCodec(), settings,
                                                  episode_id="e-0", seed=7, learner="main", counts=counts))
    assert [r[Columns.ACTION_TRUNCATED] for r in rows] == [True, False] * 3 + [True]
    assert counts.counts["truncated_actions"] == 4
    assert returns == pytest.approx([1.0 - 0.4, -1.0])  # X won, and paid for its four cut moves
    assert [r[Columns.REWARD] for r in rows if r[Columns.AGENT] == 0] == pytest.approx([-0.1, -0.1, -0.1, 0.9])
