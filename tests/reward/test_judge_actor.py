"""The reward actor hosting a judge, over real ZeroMQ sockets: every episode sent either reaches replay scored and
tagged by the judge, or is counted unscored with its reason; none reaches replay with a reward nobody gave it."""

import threading

import pyarrow as pa
import trio

from actors.reward.judges import JudgeConfig, JudgeScorer, judge_identity, parse_reply
from actors.reward.actor import RewardActor, RewardConfig
from streams.channels import ZmqTransport
from streams.endpoints import Inbox, Outbox
from streams.schema import Columns as C
from streams.schema import decode_table, encode_table
from streams.wire import Kind
from tests.factories import turns_episode as episode


def through_reward(reward: RewardActor, episodes: list[pa.Table]) -> tuple[list[pa.Table], dict]:
    """Send ``episodes`` to ``reward``; what a receiver standing in for replay got once every one was accounted
    for (passed on or unscored), and the actor's statistics."""
    seen = {"tables": []}

    async def main():
        transport = ZmqTransport()
        async with transport.open_receiver(capacity=16) as replay, trio.open_nursery() as nursery:
            addresses = await nursery.start(reward.run, transport, {"replay": [replay.address]})
            inbox = Inbox(replay, Kind.EPISODES, decode_table)

            async def collect():
                while True:
                    seen["tables"].append(await inbox.receive())

            nursery.start_soon(collect)
            async with transport.open_sender([addresses["episodes"]]) as sender:
                out = Outbox(sender, Kind.EPISODES, "env-0")
                for table in episodes:
                    await out.send(encode_table(table))
                with trio.fail_after(300):
                    while True:  # progress poll: until every episode is accounted for and what went on came in
                        stats = reward.statistics()
                        if (stats["episodes"] + stats["unscored"] == len(episodes)
                                and len(seen["tables"]) == stats["episodes"]):
                            break
                        await trio.sleep(0.02)
            seen["stats"] = reward.statistics()
            nursery.cancel_scope.cancel()

    trio.run(main)
    return seen["tables"], seen["stats"]



def test_a_real_judge_model_scores_or_counts_every_episode(tiny_model_dir):
    cfg = RewardConfig(scorer="judge", tokenizer_path=str(tiny_model_dir), judge=JudgeConfig(
        model_path=str(tiny_model_dir), batch_size=4, max_new_tokens=4, max_wait_s=1.0, timeout_s=120.0))
    reward = RewardActor(cfg)
    sent = [episode(f"env-0-{i}", ((0, "[1]"), (1, "[5]"), (0, "[9]")) if i % 2 else ((0, f"[{i}]"),))
            for i in range(6)]
    tables, stats = through_reward(reward, sent)
    tag = judge_identity(tiny_model_dir, cfg.judge)
    assert stats["episodes"] + stats["unscored"] == len(sent) == stats["episodes"] + sum(
        stats["unscored_by_reason"].values())
    assert set(stats["unscored_by_reason"]) <= {"unparsable"}  # a tiny model talks nonsense; it neither fails nor stalls
    assert stats["scorer"]["judged"] == 1 * 3 + 2 * 3  # each agent's last turn: one or two an episode
    assert stats["scorer"]["largest_batch"] > 1  # episodes' prompts shared a model call
    for table in tables:  # what came through is the judge's
        rows = table.to_pylist()
        assert {r[C.SCORED_BY] for r in rows} == {tag}
        assert all(0.0 <= r[C.REWARD] <= 1.0 for r in rows)
        for agent in {r[C.AGENT] for r in rows}:
            mine = [r for r in rows if r[C.AGENT] == agent]
            assert sum(r[C.REWARD] for r in mine) == mine[-1][C.EPISODE_RETURN]
    replies = reward.scorer.judge.last_replies
    assert replies and all(isinstance(reply, str) for reply in replies)


def test_episodes_a_judge_fails_on_never_reach_replay_and_are_counted_by_reason():
    release = threading.Event()

    def judge(texts):
        if any("boom" in t for t in texts):
            raise RuntimeError("out of memory")
        if any("slow" in t for t in texts):
            release.wait(30)  # held until the test ends: far past timeout_s
        return [parse_reply("hmm" if "odd" in t else "[yes]") for t in texts]

    stub = JudgeScorer(JudgeConfig(batch_size=1, max_wait_s=0.0, timeout_s=1.0), judge, "judge:stub@0")
    words = ("ok", "boom", "odd", "fine")
    try:  # the slow one alone, after the others: no judge call starts while an abandoned one runs
        tables, stats = through_reward(RewardActor(RewardConfig(), scorer=stub),
                                       [episode(f"env-0-{w}", ((0, w),)) for w in words])
        slow_tables, slow_stats = through_reward(RewardActor(RewardConfig(), scorer=stub),
                                                 [episode("env-0-slow", ((0, "slow"),))])
    finally:
        release.set()
    assert sorted(t.column(C.EPISODE_ID)[0].as_py() for t in tables) == ["env-0-fine", "env-0-ok"]
    assert all(t.column(C.SCORED_BY).to_pylist() == ["judge:stub@0"] and t.column(C.REWARD).to_pylist() == [1.0]
               for t in tables)
    assert stats["unscored_by_reason"] == {"error": 1, "unparsable": 1} and stats["unscored"] == 2
    assert stats["episodes"] == 2
    assert slow_tables == [] and slow_stats["unscored_by_reason"] == {"timeout": 1}


def test_drop_every_leaves_every_nth_episode_unscored_for_chaos_runs():
    """``reward.args.drop_every``: the fault benchmarks/chaos.py injects (a scorer that drops a share of episodes),
    counted as unscored with its own reason; 0 drops nothing, and a bad value is refused."""
    reward = RewardActor(RewardConfig(drop_every=3))
    tables, stats = through_reward(reward, [episode(f"env-0-{i}", ((0, "ok"),)) for i in range(7)])
    assert len(tables) == 5 and stats["unscored"] == 2 and stats["unscored_by_reason"] == {"injected": 2}
    for bad in (-1, 1.5, True):
        try:
            RewardConfig(drop_every=bad)
        except ValueError as error:
            assert "drop_every must be an integer >= 0" in str(error)
        else:
            raise AssertionError(f"drop_every={bad!r} accepted")
