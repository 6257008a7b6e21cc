"""Role games through the real path: a reward model hosted by the reward actor scores a Ray run's episodes, and
the attacker/defender game plays as a two-member league on Ray."""

import subprocess
import sys

import pyarrow as pa
import pytest

from actors.replay.spill import _read_batches
from streams.schema import Columns

pytestmark = pytest.mark.ray


def spilled_rows(replay_dir) -> list[dict]:
    rows = []
    for path in sorted(replay_dir.rglob("episodes-*.arrows")):
        rows += pa.Table.from_batches(list(_read_batches(path))).select(
            [Columns.ENV_NAME, Columns.ROLE, Columns.SCORED_BY, Columns.REWARD, Columns.EPISODE_RETURN]).to_pylist()
    return rows


@pytest.mark.timeout(600)
def test_a_reward_model_hosted_by_the_reward_actor_scores_a_ray_runs_episodes(tiny_model_dir, tmp_path):
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    judge = tmp_path / "reward-model"  # a one-logit classifier of the tiny model's shape: a score for any text
    config = AutoConfig.from_pretrained(tiny_model_dir)
    config.num_labels = 1
    AutoModelForSequenceClassification.from_config(config).save_pretrained(judge)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(judge)
    args = [f"model.path={tiny_model_dir}", f"run.dir={tmp_path}", "run.name=judged", "run.minutes=2",
            "run.max_versions=3", "replay.args.batch_episodes=8", "replay.args.capacity_episodes=16",
            "env.args.concurrency=8", "eval.every_s=0", "eval.endpoint_games_per_seat=1", "sampling.max_new_tokens=4",
            "ray.num_cpus=2", "reward=judge", f"reward.args.judge.model_path={judge}",
            "reward.args.judge.kind=classifier"]
    done = subprocess.run([sys.executable, "-m", "actors.cli", "launch", *args], capture_output=True, text=True,
                          timeout=560)
    assert done.returncode == 0, done.stderr[-3000:]
    # what the learner trained (the episode dataset) and what replay still holds (a checkpoint may have compacted
    # every spilled episode away: it did once, in a fresh-clone run)
    import pyarrow.parquet as pq

    trained = pq.read_table(tmp_path / "judged" / "episodes").select(
        [Columns.SCORED_BY, Columns.EPISODE_RETURN]).to_pylist()
    rows = trained + spilled_rows(tmp_path / "judged" / "replay")
    assert trained and {r[Columns.SCORED_BY].split("@")[0] for r in rows} == {"judge:reward-model"}
    assert all(0.0 <= r[Columns.EPISODE_RETURN] <= 1.0 for r in rows)  # sigmoid scores, not the game's -1/0/1
    import json

    summary = json.loads((tmp_path / "judged" / "summary.json").read_text())
    assert summary["final_version"] >= 3


@pytest.mark.slow  # about two minutes on Ray
@pytest.mark.timeout(900)
def test_the_attacker_defender_game_plays_as_a_two_member_league_on_ray(ray_session, tiny_model_dir, tmp_path):
    import threading

    from actors.cli import load_config
    from actors.runs.driver import Driver

    cfg = load_config([f"model.path={tiny_model_dir}", f"run.dir={tmp_path}", "run.name=keepers", "run.minutes=6",
                       "run.max_matches=120", "run.log_every_s=0.5", "env=secret_keeper",
                       "league=secret_keeper",
                       "replay.args.batch_episodes=4", "replay.args.capacity_episodes=8", "env.args.concurrency=8",
                       "eval.opponents=[secret_keeper_script]", "eval.games_per_seat=1",
                       "eval.endpoint_games_per_seat=1", "eval.every_s=0", "learner.checkpoint_every=2",
                       "league.args.snapshot_every_versions=2", "league.args.snapshot_win_rate=null",
                       "sampling.max_new_tokens=8"], "league")
    outcome, run = {}, Driver(cfg)
    runner = threading.Thread(target=lambda: outcome.setdefault("summary", run.execute()))
    runner.start()
    runner.join(timeout=800)
    summary = outcome["summary"]
    assert not summary["interrupted"]
    table = summary["table"]
    assert table["matches"] >= 120 and table["errored_matches"] == 0 and len(table["ratings"]) >= 3
    assert {s["member"] for s in table["snapshots"].values()} == {"main", "exploiter"}
    rows = spilled_rows(tmp_path / "keepers" / "replay")
    assert {r[Columns.ROLE] for r in rows} == {"attacker", "defender"} and {r[Columns.ENV_NAME] for r in rows} == \
        {"secret_keeper"}
