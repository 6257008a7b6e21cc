"""The reward actor's judge, without a model: replies parsed, scores made rewards and returns, batches gathered,
and a judge that fails, times out or answers nonsense leaves its episodes unscored (never zero); a one-logit
classifier reward model built here scores finitely, tagged with its identity."""

import math
import threading

import pyarrow as pa
import pytest
import trio

from actors.reward.judges import DEFAULT_TEMPLATE, JudgeConfig, JudgeScorer, judge_identity, parse_reply
from actors.reward.actor import RewardConfig
from actors.reward.scorers import FunctionScorer, Unscored, apply_scores, as_scorer, game_outcome
from streams.schema import Columns as C
from tests.factories import turns_episode as episode



@pytest.mark.parametrize("reply, score", [
    ("[yes]", 1.0), ("  [NO], because", 0.0), ("0.7", 0.7), ("score: 1", 1.0), (".25 or so", 0.25),
    ("0.2 [yes]", 0.2), ("[yes] 0.2", 1.0), ("3", None), ("1.5 [yes]", None), ("maybe", None), ("", None),
    ("v2", None), ("yes", None),
])
def test_a_reply_is_read_for_a_verdict_or_a_number_in_the_unit_interval(reply, score):
    assert parse_reply(reply) == score


def test_scores_become_the_last_turns_reward_and_every_rows_return():
    table = apply_scores(episode(turns=((0, "a"), (1, "b"), (0, "c"), (1, "d"))), {0: 0.75, 1: 0.0}, "judge:x@1")
    rows = table.to_pylist()
    assert [r[C.REWARD] for r in rows] == [0.0, 0.0, 0.75, 0.0]
    assert [r[C.EPISODE_RETURN] for r in rows] == [0.75, 0.0, 0.75, 0.0]
    for agent in (0, 1):  # an agent's return is the sum of its rewards, as the env credits them
        mine = [r for r in rows if r[C.AGENT] == agent]
        assert sum(r[C.REWARD] for r in mine) == mine[0][C.EPISODE_RETURN]
    assert {r[C.SCORED_BY] for r in rows} == {"judge:x@1"}
    kept = apply_scores(episode(turns=((0, "a"), (1, "b"))), {1: 1.0}, "j").to_pylist()
    assert kept[0][C.REWARD] == 1.0 and kept[0][C.SCORED_BY] == ""  # an agent without a score keeps its rows


def test_plain_functions_and_score_objects_are_both_scorers():
    assert isinstance(as_scorer(game_outcome), FunctionScorer)
    judge = JudgeScorer(JudgeConfig(), lambda texts: [1.0] * len(texts), "j")
    assert as_scorer(judge) is judge
    assert trio.run(as_scorer(game_outcome).score, episode()).equals(episode())
    with pytest.raises(TypeError):
        as_scorer(3)


@pytest.mark.parametrize("change, message", [
    ({"kind": "oracle"}, "unknown judge kind"), ({"template": "{prompt}"}, "put {response} in it"),
    ({"template": "{response} {score}"}, "does not format"), ({"batch_size": 0}, "batch_size must be >= 1"),
    ({"timeout_s": 0}, "timeout_s > 0"), ({"device": "tpu"}, "unknown device"),
])
def test_a_bad_judge_config_is_refused_naming_what(change, message):
    with pytest.raises(ValueError, match=message):
        JudgeConfig(**change)


def test_scorer_judge_without_a_model_is_refused():
    with pytest.raises(ValueError, match="judge.model_path"):
        RewardConfig(scorer="judge")
    assert RewardConfig(scorer="judge", judge={"model_path": "/m", "batch_size": 2}).judge.batch_size == 2


def judged(scorer: JudgeScorer, *episodes: pa.Table) -> list:
    """Each episode's scored table, or its Unscored, scored side by side."""
    results = [None] * len(episodes)

    async def one(i):
        try:
            results[i] = await scorer.score(episodes[i])
        except Unscored as unscored:
            results[i] = unscored

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(scorer.run)
            async with trio.open_nursery() as scoring:
                for i in range(len(episodes)):
                    scoring.start_soon(one, i)
            nursery.cancel_scope.cancel()

    trio.run(main)
    return results


def test_waiting_prompts_are_judged_in_one_batch_and_see_the_turn():
    calls = []

    def judge(texts):
        calls.append(texts)
        return [parse_reply("[yes]" if "good" in t else "0.25") for t in texts]

    scorer = JudgeScorer(JudgeConfig(batch_size=5, max_wait_s=5.0, template="{env}|{role}|{prompt}|{response}"),
                         judge, "judge:stub@0", decode=lambda ids: "ids" + ",".join(map(str, ids)))
    episodes = [episode("env-0-1", ((0, "good"),), env="chess"), episode("env-0-2", ((0, "meh"), (1, "good"))),
                episode("env-0-3", ((0, "x"), (1, "y"), (0, "good")))]
    first, second, third = judged(scorer, *episodes)
    assert [len(c) for c in calls] == [5]  # five prompts (an agent's last turn each), one call, no waiting
    assert "chess|seat 0|ids3,4|good" in calls[0]
    assert first.column(C.REWARD).to_pylist() == [1.0]
    assert second.column(C.EPISODE_RETURN).to_pylist() == [0.25, 1.0]
    assert third.column(C.REWARD).to_pylist() == [0.0, 0.25, 1.0]
    assert set(third.column(C.SCORED_BY).to_pylist()) == {"judge:stub@0"}
    assert scorer.statistics()["judged"] == 5 and scorer.statistics()["batches"] == 1


def test_a_judge_that_fails_times_out_or_talks_nonsense_leaves_its_episodes_unscored():
    release = threading.Event()

    def judge(texts):
        if any("boom" in t for t in texts):
            raise RuntimeError("the judge's GPU fell over")
        if any("slow" in t for t in texts):
            release.wait(30)  # held until the test is done: far past timeout_s
        return [parse_reply("no idea" if "odd" in t else "[no]") for t in texts]

    scorer = JudgeScorer(JudgeConfig(batch_size=1, max_wait_s=0.0, timeout_s=1.0), judge, "j")
    try:  # the slow one alone, after the others: no call starts while an abandoned one runs
        boom, odd, fine = judged(scorer, *(episode(f"env-0-{w}", ((0, w),)) for w in ("boom", "odd", "ok")))
        slow, = judged(scorer, episode("env-0-slow", ((0, "slow"),)))
    finally:
        release.set()
    assert isinstance(boom, Unscored) and boom.reason == "error" and "fell over" in boom.detail
    assert isinstance(slow, Unscored) and slow.reason == "timeout"
    assert isinstance(odd, Unscored) and odd.reason == "unparsable"
    assert fine.column(C.REWARD).to_pylist() == [0.0] and fine.column(C.SCORED_BY).to_pylist() == ["j"]


def test_a_judge_slower_than_its_timeout_runs_one_call_at_a_time():
    """Batches that come while an abandoned call still runs wait for it and time out without calling the judge
    again (a judge slower than timeout_s used to be called by every batch, each call left running in its thread);
    once the call returns, the next batch is judged."""
    release, calls, results = threading.Event(), [], {}

    def judge(texts):
        calls.append(texts)
        if len(calls) == 1:
            release.wait(60)  # the first call hangs until the test lets it go
        return [1.0] * len(texts)

    scorer = JudgeScorer(JudgeConfig(batch_size=1, max_wait_s=0.0, timeout_s=1.0), judge, "j")

    async def score(name):
        try:
            results[name] = await scorer.score(episode(name, ((0, "x"),)))
        except Unscored as unscored:
            results[name] = unscored

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(scorer.run)
            async with trio.open_nursery() as scoring:
                for i in range(3):
                    scoring.start_soon(score, f"env-0-{i}")
            stuck = (len(calls), scorer.statistics()["abandoned_calls"])
            release.set()
            await score("env-0-9")
            nursery.cancel_scope.cancel()
        return stuck

    try:
        assert trio.run(main) == (1, 1)  # three batches, one call (abandoned)
    finally:
        release.set()
    assert all(isinstance(results[f"env-0-{i}"], Unscored) and results[f"env-0-{i}"].reason == "timeout"
               for i in range(3))
    details = sorted(results[f"env-0-{i}"].detail for i in range(3))  # the batcher's order is trio's
    assert "took longer" in details[0] and all("still ran" in d for d in details[1:]), details
    assert results["env-0-9"].column(C.REWARD).to_pylist() == [1.0] and len(calls) == 2


def test_an_episode_with_one_unscored_agent_is_unscored_whole():
    scorer = JudgeScorer(JudgeConfig(batch_size=8), lambda texts: [None if "?" in t else 1.0 for t in texts], "j")
    (result,) = judged(scorer, episode(turns=((0, "fine"), (1, "?"))))
    assert isinstance(result, Unscored) and result.reason == "unparsable"


def test_a_one_logit_classifier_scores_finitely_tagged_with_its_identity(tiny_model_dir, tmp_path):
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    def classifier(path, labels):
        config = AutoConfig.from_pretrained(tiny_model_dir)
        config.num_labels = labels
        AutoModelForSequenceClassification.from_config(config).save_pretrained(path)
        AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(path)
        return str(path)

    path = classifier(tmp_path / "rm", 1)
    results = {}
    for output in ("sigmoid", "logit"):
        cfg = RewardConfig(scorer="judge", tokenizer_path=str(tiny_model_dir),
                           judge=JudgeConfig(model_path=path, kind="classifier", classifier_output=output))
        scorer = JudgeScorer.from_config(cfg)
        results[output] = judged(scorer, episode("env-0-1"), episode("env-0-2", ((0, "x"), (1, "[2]"))))
        assert scorer.scored_by == judge_identity(path, cfg.judge) and scorer.scored_by.startswith("judge:rm@")
    for output, tables in results.items():
        scores = [s for t in tables for s in t.column(C.REWARD).to_pylist()]
        assert all(math.isfinite(s) for s in scores)
        assert all(set(t.column(C.SCORED_BY).to_pylist()) == {judge_identity(path, JudgeConfig(
            model_path=path, kind="classifier", classifier_output=output))} for t in tables)
    assert all(0 < s < 1 for t in results["sigmoid"] for s in t.column(C.EPISODE_RETURN).to_pylist())
    assert judge_identity(path, JudgeConfig(kind="classifier")) != judge_identity(path, JudgeConfig())
    two = classifier(tmp_path / "two", 2)
    with pytest.raises(ValueError, match="one logit"):
        JudgeScorer.from_config(RewardConfig(scorer="judge", judge=JudgeConfig(model_path=two, kind="classifier")))
    assert DEFAULT_TEMPLATE.format(env="e", role="r", prompt="p", response="a").count("a") >= 1
