"""The lane group: many episodes stepped by one task, each lane keeping what an episode of its own kept."""

import pyarrow as pa
import trio
import trio.testing

from actors.env.episode import EpisodeCounts
from actors.env.lanes import EpisodeSettings, LaneGroup
from actors.env.policy_client import Answers, CompletionLost
from envs.base import StepResult
from envs.registry import make
from streams.messages import Completion
from streams.schema import Columns, decode_table, encode_episode_columns, encode_episodes
from tests.support.episodes import CharCodec, Quorum


class Port:
    """A lane group's port that keeps every move asked; the test answers them (``answer_all``) tick by tick."""

    def __init__(self):
        self.asked: list[tuple[Answers, object, str, int]] = []  # (answers, token, prompt, request id)
        self.cancelled: set[int] = set()

    def post(self, answers, token, prompt_ids, max_tokens, policy) -> int:
        self.asked.append((answers, token, CharCodec().decode(prompt_ids), len(self.asked)))
        return len(self.asked) - 1

    def cancel(self, request_id: int) -> None:
        self.cancelled.add(request_id)

    def answer_all(self, write) -> int:
        """Answer every move asked so far with ``write(prompt)`` (an exception: that move's error)."""
        asked, self.asked = self.asked, []
        for answers, token, prompt, request_id in asked:
            text = write(prompt)
            if isinstance(text, Exception):
                answers.put(token, text)
            else:
                answers.put(token, Completion(request_id, CharCodec().encode(text), [-0.5] * len(text),
                                              [2] * len(text), True))
        return len(asked)


def first_free(prompt: str) -> str:
    board = prompt.split("\n", 1)[1]
    return "[" + next(c for c in board if c.isdigit() and c != "0") + "]"


async def settle():
    await trio.testing.wait_all_tasks_blocked()


def test_every_lane_waiting_is_asked_in_the_same_tick_and_one_tick_plays_every_answer():
    port, counts, ticks = Port(), EpisodeCounts(2), []
    group = LaneGroup(port, CharCodec(), EpisodeSettings("tictactoe", 6), counts)
    results = {}

    async def main():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(group.run)
            for lane in range(5):
                async def play(lane=lane):
                    results[lane] = await group.play(make("tictactoe"), ["main", "main"], episode_id=f"e-{lane}",
                                                     seed=lane, learner="main")
                nursery.start_soon(play)
            await settle()
            while len(results) < 5:
                ticks.append(port.answer_all(first_free))
                await settle()
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert ticks == [5] * 7  # the five mirror games move in lockstep: each tick, every lane asked at once
    for lane, (columns, returns) in results.items():
        assert returns == [1.0, -1.0] and len(columns) == 7
        assert columns.shared[Columns.EPISODE_ID] == f"e-{lane}" and columns.turn == list(range(7))
    assert counts.counts["episodes"] == 5 and counts.counts["turns"] == 35


class Breaks:
    """Tic-tac-toe whose step raises on its third move (a bug of the environment's)."""

    def __init__(self):
        self.game, self.moves = make("tictactoe"), 0

    def __getattr__(self, name):
        return getattr(self.game, name)

    def reset(self, seed):
        self.moves = 0
        self.game.reset(seed)

    def step(self, action):
        self.moves += 1
        if self.moves == 3:
            raise RuntimeError("the environment's bug")
        return self.game.step(action)


def test_a_lane_whose_env_raises_or_whose_move_is_lost_loses_its_episode_only():
    port, counts = Port(), EpisodeCounts(2)
    group = LaneGroup(port, CharCodec(), EpisodeSettings("tictactoe", 6), counts)
    results = {}

    async def main():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(group.run)
            games = {"broken": Breaks(), "lost": make("tictactoe"), "fine": make("tictactoe")}
            for name, game in games.items():
                async def play(name=name, game=game):
                    results[name] = await group.play(game, ["main", "main"], episode_id=name, seed=1, learner="main")
                nursery.start_soon(play)
            await settle()
            port.answer_all(first_free)
            await settle()
            port.answer_all(lambda prompt: first_free(prompt))
            await settle()  # the broken lane raised on its third move
            for answers, token, prompt, request_id in list(port.asked):
                if token[0].episode_id == "lost":
                    port.asked.remove((answers, token, prompt, request_id))
                    answers.put(token, CompletionLost("unanswered twice"))
            await settle()
            while "fine" not in results:
                port.answer_all(first_free)
                await settle()
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert results["broken"] is None and results["lost"] is None
    assert results["fine"][1] == [1.0, -1.0] and len(results["fine"][0]) == 7
    assert counts.counts["errored"] == 2 and counts.counts["lost_completions"] == 1
    assert counts.counts["episodes"] == 1


class SlowStep:
    """A one-seat game of two moves whose first step waits on ``gate`` (a slow tool) in the lane ``slow``."""

    name, num_players, current_player = "slow", 1, 0

    def __init__(self, gate: trio.Event | None):
        self.gate = gate

    def reset(self, seed):
        self.moves = 0

    def observation(self, player):
        return f"move {self.moves}"

    def step(self, action):
        self.moves += 1
        result = StepResult([float(self.moves == 2)], terminated=self.moves == 2)
        if self.gate is not None and self.moves == 1:
            return self._wait(result)
        return result

    async def _wait(self, result):
        await self.gate.wait()
        return result


def test_a_coroutine_step_leaves_the_lockstep_and_its_lane_rejoins_when_it_resolves():
    port, counts, gate = Port(), EpisodeCounts(1), trio.Event()
    group = LaneGroup(port, CharCodec(), EpisodeSettings("slow", 6), counts)
    results = {}

    async def main():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(group.run)
            for name, game in (("slow", SlowStep(gate)), ("quick", SlowStep(None))):
                async def play(name=name, game=game):
                    results[name] = await group.play(game, ["main"], episode_id=name, seed=0, learner="main")
                nursery.start_soon(play)
            await settle()
            assert port.answer_all(lambda prompt: "[1]") == 2
            await settle()
            assert port.answer_all(lambda prompt: "[1]") == 1  # the quick lane went on; the slow one waits
            await settle()
            assert "quick" in results and "slow" not in results
            gate.set()
            await settle()
            assert port.answer_all(lambda prompt: "[1]") == 1  # rejoined: its second move asked
            await settle()
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert results["slow"][1] == [1.0] and results["quick"][1] == [1.0]


def test_simultaneous_seats_are_asked_in_the_same_tick():
    port, counts = Port(), EpisodeCounts(4)
    group = LaneGroup(port, CharCodec(), EpisodeSettings("quorum", 6), counts)
    asked_per_tick, result = [], []

    async def main():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(group.run)

            async def play():
                result.append(await group.play(Quorum(), ["main"] * 4, episode_id="q", seed=0, learner="main"))
            nursery.start_soon(play)
            await settle()
            while not result:
                asked_per_tick.append(port.answer_all(lambda prompt: "[7]"))
                await settle()
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert asked_per_tick == [1, 3]  # the asker, then the three guessers together
    assert result[0][1] == [3.0, 1.0, 1.0, 1.0] and result[0][0].role == ["asker"] + ["guesser"] * 3


def test_an_episodes_columns_make_the_same_frame_as_its_rows():
    columns, returns = [], []
    for seed in (3, 4):
        port = Port()

        async def main():
            group = LaneGroup(port, CharCodec(), EpisodeSettings("tictactoe", 6), EpisodeCounts(2))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(group.run)
                played = []

                async def play():
                    played.append(await group.play(make("tictactoe"), ["main", "random"], episode_id=f"e{seed}",
                                                   seed=seed, learner="main"))
                nursery.start_soon(play)
                await settle()
                while not played:
                    port.answer_all(first_free)
                    await settle()
                nursery.cancel_scope.cancel()
            return played[0]

        played = trio.run(main)
        columns.append(played[0])
        returns.append(played[1])
    by_columns = encode_episode_columns([c.table_columns() for c in columns])
    by_rows = encode_episodes([c.rows() for c in columns])
    assert by_columns == by_rows
    for body, episode in zip(by_columns, columns):
        table = decode_table(body)
        assert table.num_rows == len(episode) and isinstance(table, pa.Table)
        assert table.column(Columns.EPISODE_RETURN).to_pylist() == [returns[columns.index(episode)][0]] * len(episode)
