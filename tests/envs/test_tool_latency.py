"""The tool-use task with heavy-tailed latency: its rules, its latency distribution, its async sleep."""

import math
import statistics

import pytest
import trio
import trio.testing

import envs
from envs.tool_latency import ToolLatencyTask


def run(async_fn, *args):
    """Run on a virtual clock: ``trio.current_time()`` advances only by the sleeps, instantly."""
    return trio.run(async_fn, *args, clock=trio.testing.MockClock(autojump_threshold=0))


def solve(task: ToolLatencyTask) -> list:
    async def main():
        results = []
        for name in task.asked:
            results.append(await task.step(f"I will call [lookup {name}] now"))
        results.append(await task.step(f"[answer {task.answer}]"))
        return results

    return run(main)


def test_looking_up_both_values_then_answering_the_sum_earns_one():
    task = ToolLatencyTask()
    observation, _ = task.reset(seed=3)
    assert "Known: nothing yet" in observation and all(name in observation for name in task.asked)
    *lookups, final = solve(task)
    assert [r[1:4] for r in lookups] == [(0.0, False, False)] * 2
    assert str(task.values[task.asked[0]]) in lookups[-1][0]
    assert final[1:4] == (1.0, True, False) and final[4]["correct"]


def test_a_wrong_answer_ends_the_task_with_nothing():
    task = ToolLatencyTask()
    task.reset(seed=3)
    result = run(task.step, f"[answer {task.answer + 1}]")
    assert result[1:4] == (0.0, True, False)


@pytest.mark.parametrize("action", ["the answer is 12", "[lookup nobody]", "[call apple]", ""])
def test_unreadable_actions_are_invalid_and_change_nothing(action):
    task = ToolLatencyTask()
    before, _ = task.reset(seed=1)
    observation, reward, terminated, truncated, info = run(task.step, action)
    assert info["invalid_action"] and info["reason"] and observation == before
    assert (reward, terminated, truncated, task.turns) == (0.0, False, False, 0)


def test_the_episode_is_truncated_after_max_turns():
    task = ToolLatencyTask(max_turns=3, latency_median_s=0.0)
    task.reset(seed=0)

    async def main():
        return [await task.step("[lookup apple]") for _ in range(3)]

    assert [r[3] for r in run(main)] == [False, False, True]


def test_a_tool_call_sleeps_its_drawn_latency_on_the_event_loop():
    task = ToolLatencyTask(latency_median_s=0.2)
    task.reset(seed=5)

    async def main():
        start = trio.current_time()
        await task.step(f"[lookup {task.asked[0]}]")
        return trio.current_time() - start

    elapsed = run(main)
    assert task.latencies and elapsed == pytest.approx(task.latencies[0])


def test_latencies_are_heavy_tailed_capped_and_reproducible():
    task = ToolLatencyTask(latency_median_s=0.05, latency_sigma=1.0, latency_max_s=2.0)
    task.reset(seed=11)
    draws = [task.draw_latency() for _ in range(4000)]
    assert statistics.median(draws) == pytest.approx(0.05, rel=0.1)
    assert max(draws) <= 2.0
    # log-normal with sigma 1: about 5% of calls take over 5x the median, a thin-tailed draw almost never
    slow = sum(d > 0.25 for d in draws) / len(draws)
    assert 0.03 < slow < 0.08
    assert statistics.mean(draws) > 1.4 * statistics.median(draws)  # the mean is pulled up by the tail
    again = ToolLatencyTask(latency_median_s=0.05, latency_sigma=1.0, latency_max_s=2.0)
    again.reset(seed=11)
    assert [again.draw_latency() for _ in range(4000)] == draws
    assert task.values == again.values and task.asked == again.asked


def test_generation_budgets_vary_within_the_configured_range():
    task = ToolLatencyTask(min_new_tokens=4, max_new_tokens=64, latency_median_s=0.0, max_turns=100)
    task.reset(seed=2)
    budgets = [task.max_tokens]

    async def main():
        for _ in range(40):
            await task.step("[lookup apple]")
            budgets.append(task.max_tokens)

    run(main)
    assert all(4 <= b <= 64 for b in budgets) and len(set(budgets)) > 10
    assert ToolLatencyTask().max_tokens is None  # unset: the env actor's default


def test_bad_arguments_get_a_clear_error():
    with pytest.raises(ValueError, match="lookups"):
        ToolLatencyTask(lookups=0)
    with pytest.raises(ValueError, match="min_new_tokens"):
        ToolLatencyTask(min_new_tokens=8)
    with pytest.raises(ValueError, match="does not take these arguments"):
        envs.make("tool_latency", colour="red")


def test_through_make_it_is_a_one_player_game_with_retries():
    game = envs.make("tool_latency", max_retries=1, retry_penalty=-0.25, invalid_penalty=-1.0, latency_median_s=0)
    game.reset(4)
    assert game.num_players == 1 and game.current_player == 0
    first = run(game.step, "no idea")
    assert first.invalid and not first.terminated and first.rewards == [-0.25]
    assert game.observation(0).startswith("Your answer 'no idea' is not a valid move")
    second = run(game.step, "still no idea")
    assert second.invalid and second.terminated and second.rewards == [-1.0] and second.info["forfeit"] == 0
    assert math.isclose(sum(first.rewards + second.rewards), -1.25)
