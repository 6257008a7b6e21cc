"""A scorer that drops episodes does not stop a run: at max_staleness 0 (where one episode never given back used to
stop it for good, silently) a judge-like scorer that leaves one episode in five unscored, through ``tidal launch``
in local mode, reaches its budget of versions, and the metrics say what was dropped and given back."""

import json

from actors.cli import launch, load_config
from actors.observe.monitor import STALL_ROWS
from actors.reward.actor import SCORERS
from actors.reward.scorers import Unscored


def one_in_five_unscored():
    calls = []

    def score(episode):
        calls.append(1)
        if len(calls) % 5 == 0:
            raise Unscored("timeout", "the judge took too long")
        return episode

    return score


def test_at_eta_0_a_scorer_dropping_one_episode_in_five_runs_to_its_budget(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(SCORERS, "one_in_five", one_in_five_unscored())  # local mode: the actors are in this process
    overrides = [f"model.path={tiny_model_dir}", f"run.dir={tmp_path}", "run.name=drops", "run.mode=local",
                 "run.progress=false", "run.max_versions=8", "run.minutes=2", "run.log_every_s=1",
                 "learner.max_staleness=0", "reward.args.scorer=one_in_five", "replay.args.batch_episodes=8",
                 "replay.args.capacity_episodes=16", "env.args.concurrency=8", "sampling.max_new_tokens=4",
                 "eval.every_s=0", "eval.games_per_seat=1", "eval.endpoint_games_per_seat=1",
                 "observe.tensorboard=false", "observe.dataset=false"]
    summary = launch(load_config(overrides))
    # before: stuck at its first versions for its 2 minutes
    assert summary["final_version"] >= 8 and not summary["interrupted"]
    rows = [json.loads(line) for line in (tmp_path / "drops" / "metrics.jsonl").read_text().splitlines()]
    last = rows[-1]
    assert last["unscored_episodes"] >= 8 and 0 < last["given_back"]["unscored"] <= last["unscored_episodes"]
    # a row or two may find nothing under way while the learner updates; never the STALL_ROWS that say stalled
    assert max(row.get("stalled_rows", 0) for row in rows) < STALL_ROWS
