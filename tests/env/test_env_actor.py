"""The env actor against a scripted policy (a fake rollout actor on the same loop), over in-memory streams."""

import re

import pytest
import trio
import trio.testing
from transformers import AutoTokenizer

from actors.env.actor import EnvActor, EnvConfig
from actors.rollout.scripted import serve_scripted
from streams.channels import MemoryTransport
from streams.messages import Completion
from streams.schema import Columns
from tests.factories import run_episodes, scripted_env



def test_an_invalid_action_ends_the_episode_with_a_penalty_and_is_counted(tiny_model_dir):
    *episodes, stats = run_episodes(tiny_model_dir, "I play [1]", episodes=3)
    for table in episodes:
        rows = table.to_pylist()
        # X takes cell 1, then O answers [1] too: invalid, the game ends, O gets -1 and X 0
        assert [r[Columns.AGENT] for r in rows] == [0, 1]
        assert [r[Columns.INVALID_ACTION] for r in rows] == [False, True]
        assert [r[Columns.EPISODE_RETURN] for r in rows] == [0.0, -1.0]
        assert rows[1][Columns.REWARD] == -1.0 and rows[1][Columns.TERMINATED]
        assert all(r[Columns.POLICY_VERSIONS] == [5] * len(r[Columns.ACTION_IDS]) for r in rows)
        assert rows[0][Columns.ACTION_TEXT] == "I play [1]"
        assert {r[Columns.MATCHUP] for r in rows} == {"main,main"}
    assert stats["invalid_actions"] >= 3 and stats["errored"] == 0


def test_the_answer_form_and_format_penalty_reach_the_episodes(tiny_model_dir):
    """env.args.answer=boxed: "I play [1]" holds no box, so X's first move is unreadable and forfeits (with the
    format penalty); "\\boxed{1}" is read, and O's same answer is illegal, not unreadable (no format penalty)."""
    *episodes, stats = run_episodes(tiny_model_dir, "I play [1]", episodes=3, answer="boxed", format_penalty=-0.5)
    for table in episodes:
        rows = table.to_pylist()
        assert len(rows) == 1 and rows[0][Columns.INVALID_ACTION] and rows[0][Columns.REWARD] == -1.5
    assert stats["unreadable_actions"] >= 3 and stats["invalid_actions"] == stats["unreadable_actions"]
    *episodes, stats = run_episodes(tiny_model_dir, "\\boxed{1}", episodes=3, answer="boxed", format_penalty=-0.5)
    for table in episodes:
        assert [r[Columns.REWARD] for r in table.to_pylist()] == [0.0, -1.0]
    assert stats["unreadable_actions"] == 0 and stats["invalid_actions"] >= 3


def test_a_share_of_training_games_against_the_fixed_opponent(tiny_model_dir):
    *episodes, _ = run_episodes(tiny_model_dir, "[5]", episodes=40, opponent_share=1.0)
    for table in episodes:
        seats = set(table.column(Columns.AGENT).to_pylist())
        assert len(seats) == 1  # only the policy's seat has rows; the opponent is not trained on
        expected = "main,random" if seats == {0} else "random,main"
        assert set(table.column(Columns.MATCHUP).to_pylist()) == {expected}
    assert {next(iter(set(t.column(Columns.AGENT).to_pylist()))) for t in episodes} == {0, 1}


def first_free_cell_as_x(prompt: str) -> str:
    """Plays X (the first free cell); forfeits every game as O."""
    board = re.search(r"You are X\.\n(.*?)\nMove:", prompt, re.S)
    return f"[{re.search(r'[1-9]', board.group(1)).group()}]" if board else "pass"


def test_games_against_the_fixed_opponent_go_to_the_seat_where_the_policy_is_weaker(tiny_model_dir):
    *episodes, stats = run_episodes(tiny_model_dir, first_free_cell_as_x, episodes=300, opponent_share=1.0,
                                    batch_episodes=300, opponent_seat="hard", opponent_seat_decay=0.98)
    seat_of = [table.column(Columns.AGENT)[0].as_py() for table in episodes]
    assert {0, 1} <= set(seat_of[:20])  # both seats at first: no scores yet
    probabilities = stats["opponent_seat_probabilities"]
    assert probabilities["1"] > 0.7 and abs(sum(probabilities.values()) - 1.0) < 1e-9  # O always forfeits
    assert seat_of[150:].count(1) > 0.6 * len(seat_of[150:])


def test_an_unknown_opponent_seat_weighting_is_refused(tiny_model_dir):
    with pytest.raises(ValueError, match="opponent_seat 'weakest'"):
        EnvConfig(tokenizer_path=str(tiny_model_dir), opponent_seat="weakest")


class FlakyTicTacToe:
    """TicTacToe whose every other episode raises on its second move: an environment with a bug."""

    episodes = 0

    def __init__(self):
        from envs.tictactoe import TicTacToe

        self.game, self.name, self.num_players = TicTacToe(), "flaky", 2

    def __getattr__(self, name):
        return getattr(self.game, name)

    def reset(self, seed):
        FlakyTicTacToe.episodes += 1
        self.broken = FlakyTicTacToe.episodes % 2 == 0
        self.game.reset(seed)

    def step(self, text):
        if self.broken and self.game.moves == 1:
            raise RuntimeError("the environment broke")
        return self.game.step(text)


def test_an_environment_that_raises_loses_its_episode_only(tiny_model_dir, monkeypatch, caplog):
    from envs import registry

    monkeypatch.setitem(registry.ENVIRONMENTS, "flaky", registry.Registered(FlakyTicTacToe, "2", "raises"))
    *episodes, stats = run_episodes(tiny_model_dir, "[5]", episodes=6, env_name="flaky")
    assert len(episodes) == 6 and stats["errored"] >= 5  # the others kept going
    assert all(len(table) == 2 for table in episodes)  # whole games: X takes 5, O repeats it and forfeits
    errors = [r for r in caplog.records if "raised in episode" in r.getMessage()]
    # each errored episode is logged with its traceback (more may end between the snapshot and the stop)
    assert len(errors) >= stats["errored"] and all("the environment broke" in str(r.exc_info[1]) for r in errors)


def test_a_refused_generation_drops_its_episode_with_the_reason_and_the_others_go_on(tiny_model_dir, caplog):
    answered = []

    async def refusing_rollout(transport, receiver, tokenizer, *args):
        def reply(request):  # every third request refused, as vLLM refuses a temperature above 2
            answered.append(request.request_id)
            if len(answered) % 3 == 0:
                return Completion.refused(request.request_id, "temperature must be in [0, 2], got 5.0")
            tokens = tokenizer("[5]")["input_ids"] + [tokenizer.eos_token_id]
            return Completion(request.request_id, tokens, [-0.5] * len(tokens), [5] * len(tokens), True)

        await serve_scripted(transport, receiver, reply)

    *episodes, stats = run_episodes(tiny_model_dir, None, episodes=6, rollout=refusing_rollout)
    assert len(episodes) == 6 and stats["refused_generations"] >= 1
    assert stats["errored"] >= stats["refused_generations"]
    refusals = [r for r in caplog.records if "refused generation request" in r.getMessage()]
    assert refusals and all("got 5.0" in r.getMessage() for r in refusals)
    assert not [r for r in caplog.records if "raised in episode" in r.getMessage()]


def tool_script(prompt: str) -> str:
    """Looks up the asked values one by one, then answers their sum (a perfect policy for tool_latency)."""
    import re

    asked = re.search(r"values of (\w+) and (\w+)", prompt).groups()
    known = dict(re.findall(r"(\w+) = (\d+)", prompt))
    missing = [name for name in asked if name not in known]
    return f"[lookup {missing[0]}]" if missing else f"[answer {sum(int(known[n]) for n in asked)}]"


def test_single_agent_multi_turn_episodes_with_slow_tools_overlap(tiny_model_dir):
    from envs.tool_latency import ToolLatencyTask

    clock, requests = trio.testing.MockClock(autojump_threshold=0), []
    task_args = {"latency_median_s": 1.0, "min_new_tokens": 2, "max_new_tokens": 30}
    *episodes, stats = run_episodes(tiny_model_dir, tool_script, episodes=16, clock=clock, record_requests=requests,
                                    concurrency=16, env_name="tool_latency", env_args=task_args)
    tool_seconds = []
    for table in episodes:
        rows = table.to_pylist()
        assert [r[Columns.TURN] for r in rows] == [0, 1, 2] and {r[Columns.AGENT] for r in rows} == {0}
        assert [r[Columns.REWARD] for r in rows] == [0.0, 0.0, 1.0] and rows[-1][Columns.TERMINATED]
        assert all(r[Columns.EPISODE_RETURN] == 1.0 for r in rows)
        # replaying the recorded actions on the same seed gives the latencies this episode waited
        task = ToolLatencyTask(**task_args)
        task.reset(rows[0][Columns.SEED])
        trio.run(lambda: _replay(task, [r[Columns.ACTION_TEXT] for r in rows]),
                 clock=trio.testing.MockClock(autojump_threshold=0))
        tool_seconds.append(sum(task.latencies))
    assert stats["episodes"] >= 16 and stats["invalid_actions"] == 0 and stats["errored"] == 0
    # episodes waited on their tools side by side: the virtual time is far less than their total wait
    assert clock.current_time() < 0.5 * sum(tool_seconds)
    assert clock.current_time() >= max(tool_seconds)
    budgets = {r.max_tokens for r in requests}
    assert len(budgets) > 5 and all(2 <= b <= 30 for b in budgets)  # each turn's budget from the task


async def _replay(task, actions):
    for action in actions:
        await task.step(action)


def test_invalid_actions_are_retried_then_forfeited_and_counted(tiny_model_dir):
    *episodes, stats = run_episodes(tiny_model_dir, "pass", episodes=4, env_name="tool_latency", max_retries=2,
                                    retry_penalty=-0.1, invalid_penalty=-1.0, env_args={"latency_median_s": 0})
    for table in episodes:
        rows = table.to_pylist()
        assert [r[Columns.INVALID_ACTION] for r in rows] == [True, True, True]
        assert [r[Columns.REWARD] for r in rows] == pytest.approx([-0.1, -0.1, -1.0])
        assert rows[-1][Columns.EPISODE_RETURN] == pytest.approx(-1.2)
    assert stats["invalid_actions"] >= 12 and stats["forfeits"] >= 4


def test_a_training_episode_behind_the_bound_plays_on_and_is_delivered_whole(tiny_model_dir):
    """The scripted policy answers as version 5 while the learner is at 8 and eta = 2: every turn is already too
    old to train. The env actor still plays the game out and delivers all of it: it is the learner that drops
    stale turns (an episode's later turns, sampled with newer weights, stay trainable)."""
    seen = {}

    async def main():
        async with scripted_env(tiny_model_dir, "[5]", 5, concurrency=4, max_staleness=2) as (env, inbox):
            env.learner_version = 8
            env.set_training(True)
            with trio.fail_after(60):
                seen["episode"] = await inbox.receive()
            seen["stats"] = env.statistics()

    trio.run(main)
    rows = seen["episode"].to_pylist()
    assert len(rows) >= 2 and rows[-1][Columns.TERMINATED]  # played to its end: the second [5] forfeits
    assert {v for r in rows for v in r[Columns.POLICY_VERSIONS]} == {5}
    assert seen["stats"]["started"] <= seen["stats"]["admission_limit"]


def test_a_rebalanced_share_admits_at_once_and_a_retired_actor_drains(tiny_model_dir):
    """eta = 0 and batches of 4: at version 0 the actor may start 4 episodes, then waits. A rebalance that moves
    its count by -2 (a share of a scale) wakes it, and it starts exactly 2 more, with no new version. Retired,
    it starts nothing more and says ``drained`` once every episode it started is delivered."""
    seen = {}

    async def main():
        async with scripted_env(tiny_model_dir, "[5]", 0, concurrency=8, max_staleness=0, batch_episodes=4,
                                admission_slot=(1, 2)) as (env, inbox):  # half of 4: 2
            await trio.testing.wait_all_tasks_blocked()  # its trainer waits for training to be on
            env.set_training(False)  # already off (a paused joiner is told again): must not strand the trainer
            env.set_training(True)
            episodes = [await inbox.receive() for _ in range(2)]
            while env.statistics()["admission_waits"] == 0:
                await trio.sleep(0.01)
            seen["before"] = env.statistics()
            seen["offset"] = env.rebalance((0, 1), -2)  # all of 4 now, with its 2 counted as 0: 4 more
            episodes += [await inbox.receive() for _ in range(4)]
            env.retire()
            while not env.statistics()["drained"]:
                await trio.sleep(0.01)
            seen["after"] = env.statistics()
            with trio.move_on_after(0.3):  # nothing more comes
                episodes.append(await inbox.receive())
            seen["episodes"] = len(episodes)

    trio.run(main)
    before, after = seen["before"], seen["after"]
    assert before["started"] == 2 and before["admission_limit"] == 2 and before["admission_offset"] == 0
    assert seen["offset"] == -2 and seen["episodes"] == 6
    assert after["started"] == 4 and after["admission_limit"] == 4 and after["admission_slot"] == [0, 1]
    assert after["train_episodes"] == 6 and after["training_in_flight"] == 0


def test_a_rebalance_to_a_slot_out_of_range_is_refused(tiny_model_dir):
    env = EnvActor(EnvConfig(tokenizer_path=str(tiny_model_dir)))
    with pytest.raises(ValueError, match="admission slot"):
        env.rebalance((2, 2), 0)


def evaluate_without_model(tiny_model_dir, games_per_seat, concurrency=16, env_name="tictactoe", **kwargs) -> dict:
    """An env actor's evaluation with a fixed player in the evaluated seat: no rollout is ever asked."""
    result = {}

    async def main():
        transport = MemoryTransport()
        async with transport.open_receiver() as requests, transport.open_receiver() as rewards, \
                trio.open_nursery() as nursery:
            env = EnvActor(EnvConfig(tokenizer_path=str(tiny_model_dir), concurrency=concurrency, env_name=env_name))
            await nursery.start(env.run, transport, {"rollout": [requests.address], "reward": [rewards.address]})
            env.evaluate("calibration", games_per_seat, **kwargs)
            while not (summary := env.statistics()["evaluations"][0])["done"]:
                await trio.sleep(0.01)
            result.update(summary=summary, stats=env.statistics(), requests=requests.statistics())
            nursery.cancel_scope.cancel()

    trio.run(main)
    return result


def test_an_evaluation_can_seat_a_fixed_player_minimax_never_loses_to_random(tiny_model_dir):
    result = evaluate_without_model(tiny_model_dir, 30, opponent="random", player="minimax")
    seats = result["summary"]["seats"]
    assert [seats[s]["games"] for s in (0, 1)] == [30, 30] and all(seats[s]["losses"] == 0 for s in (0, 1))
    assert seats[0]["wins"] > 20  # first to move, perfect play beats random almost always
    assert result["summary"]["nonloss"] == 1.0 and result["stats"]["turns"] == 0  # the policy never played
    assert result["stats"]["steps"] >= 60 * 5


def test_an_evaluation_plays_every_game_once_and_counts_the_errored_apart(tiny_model_dir, monkeypatch):
    """50 games on 8 workers; every other game raises: 25 results in the tally, 25 errored, none played twice."""
    from envs import registry

    monkeypatch.setitem(registry.ENVIRONMENTS, "flaky", registry.Registered(FlakyTicTacToe, "2", "raises"))
    monkeypatch.setattr(FlakyTicTacToe, "episodes", 0)
    result = evaluate_without_model(tiny_model_dir, 25, concurrency=8, env_name="flaky", opponent="random",
                                    player="random")
    seats, stats = result["summary"]["seats"], result["stats"]
    assert FlakyTicTacToe.episodes == 50  # each game reset once: played once
    assert result["summary"]["done"] and stats["errored"] == 25 and stats["episodes"] == 25
    assert sum(seats[s]["games"] for s in seats) == 25 and set(seats) <= {0, 1}


def test_the_token_budget_is_raised_to_fit_the_games_longest_move(tiny_model_dir):
    """Six players with two dice each bid up to ``[bid 12 6]``: more tokens than a budget of 4 holds, so every
    request asks for the longest move and EOS; a budget that holds every move is kept as configured."""
    from envs.liars_dice import LiarsDice

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    moves = LiarsDice(players=6).action_vocabulary()
    assert "[bid 12 6]" in moves
    needed = max(len(tokenizer(move, add_special_tokens=False)["input_ids"]) for move in moves) + 1
    assert needed > 4
    requests = []
    run_episodes(tiny_model_dir, "[liar]", episodes=2, record_requests=requests, env_name="liars_dice",
                 max_new_tokens=4, env_args={"players": 6})
    assert requests and {r.max_tokens for r in requests} == {needed}
    requests.clear()
    run_episodes(tiny_model_dir, "[5]", episodes=2, record_requests=requests, max_new_tokens=8)
    assert requests and {r.max_tokens for r in requests} == {8}


def test_a_role_games_task_buffer_is_kept_with_the_run_and_loaded_by_the_next_life(tmp_path):
    """The env actor saves its game's task buffer when it stops, and a later actor loads it; its statistics
    carry the buffer's."""
    from actors.env.actor import EnvActor, EnvConfig
    from envs.task_buffer import shared_buffer

    def actor(buffer_name: str) -> EnvActor:
        return EnvActor(EnvConfig(tokenizer_path="", env_name="propose_solve", tasks_dir=str(tmp_path),
                                  env_args={"buffer": buffer_name, "solvers": 2}), name="env-0")

    first = actor("kept-1")
    shared_buffer("kept-1", 1024).record((3, 4, 5), 17, 0.5)

    async def keep_a_while(env: EnvActor) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(env._keep_tasks, tmp_path / "env-0.arrows")
            await trio.sleep(0)
            nursery.cancel_scope.cancel()  # the actor stops: the buffer is saved

    trio.run(keep_a_while, first)
    assert first.statistics()["task_buffer"]["size"] == 1
    second = actor("kept-2")  # another life's buffer, empty until it loads the run's
    assert second.statistics()["task_buffer"]["size"] == 0
    trio.run(keep_a_while, second)
    assert second.statistics()["task_buffer"]["size"] == 1 and shared_buffer("kept-2", 1024).get((3, 4, 5), 17)
