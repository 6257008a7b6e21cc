"""A run killed with SIGKILL resumes from its last checkpoint at the same policy version: `tidal launch resume=`."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest
import torch

from safetensors.torch import load_file

from actors.cli import load_config
from actors.learner.ledger import ledger_path, read_ledger, weights_digest
from actors.models.checkpoint_dir import TRAINER_STATE, find_checkpoint
from actors.replay.spill import Spill, episode_life
from tests.factories import dataset_accounts

SMALL = ["replay.args.batch_episodes=8", "replay.args.capacity_episodes=16", "env.args.concurrency=8",
         "eval.games_per_seat=4", "eval.endpoint_games_per_seat=4", "eval.every_s=0", "sampling.max_new_tokens=4",
         "run.log_every_s=0.5"]


def checkpointed_version(run) -> int | None:
    checkpoint = find_checkpoint(run / "policy")
    try:
        return torch.load(checkpoint / TRAINER_STATE, weights_only=False)["version"] if checkpoint else None
    except (OSError, RuntimeError, EOFError):  # being swapped in right now
        return None


@pytest.mark.ray
def test_a_killed_run_resumes_at_its_checkpointed_version(tiny_model_dir, tmp_path):
    run = tmp_path / "killed"
    first = [f"model.path={tiny_model_dir}", f"run.dir={tmp_path}", "run.name=killed", "run.mode=local",
             "run.local_transport=zmq", "run.minutes=5", "learner.checkpoint_every=1", *SMALL]
    process = subprocess.Popen([sys.executable, "-m", "actors.cli", "launch", *first], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while (checkpointed_version(run) or 0) < 2:  # a few updates, each checkpointed
        assert process.poll() is None and time.monotonic() < deadline, "the run ended or stalled before training"
        time.sleep(0.2)
    os.kill(process.pid, signal.SIGKILL)  # no clean stop: no final checkpoint, no summary
    process.communicate(timeout=60)
    assert not (run / "summary.json").exists()
    version = checkpointed_version(run)
    rows_before = len((run / "metrics.jsonl").read_text().splitlines())

    resumed = subprocess.run(
        [sys.executable, "-m", "actors.cli", "launch", f"resume={run}", f"run.max_versions={version + 2}",
         f"model.path={tiny_model_dir}",  # a resume takes the model only from its command line
         "run.mode=ray", "ray.num_cpus=2"], capture_output=True, text=True, timeout=400)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_version"] >= version + 2
    tags = {e["tag"]: e for e in summary["evaluations"]}
    assert "start" in tags and "final" in tags  # the curve holds both lives of the run
    assert tags["resume"]["version_min"] == version  # played by the checkpointed policy, nothing older
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) > rows_before
    assert all(r["version"] >= version for r in rows[rows_before:])
    elapsed = [r["elapsed_s"] for r in rows]
    assert elapsed == sorted(elapsed)  # one clock across the kill
    # the stop wrote a last checkpoint (the learner may have made one more update after the last metrics row)
    assert checkpointed_version(run) >= summary["final_version"]
    # replay took over the killed life's live episodes instead of having them played again; ids name their life
    spill = Spill(str(run / "replay" / summary["life"]))
    taken = spill.state.inherited
    assert taken["life"] < summary["life"] and taken["episodes"] > 0, taken
    held, batches = spill.load()
    lives = {episode_life(i) for i in [*held, *spill.state.consumed, *(i for ids in batches.values() for i in ids)]}
    assert lives <= {taken["life"], summary["life"]} and summary["life"] in lives
    # the episode dataset holds every episode the checkpointed learner trained, across the kill, exactly once:
    # the killed life's batches past its checkpoint were removed (replay took their episodes over)
    accounts = dataset_accounts(run)
    assert set(accounts["per_life"]) == {taken["life"], summary["life"]}, accounts
    assert sum(accounts["per_life"].values()) == accounts["trained"] and accounts["twice"] == [], accounts
    files = f"{run}/episodes/*/*/*.parquet"
    last_batch = duckdb.sql(f"select max(batch_seq) from read_parquet('{files}') where life = '{taken['life']}'")
    assert last_batch.fetchall()[0][0] <= taken["after"]  # nothing past the checkpoint the resume went on from
    # `tidal replay`: the learner of both lives re-run from its records, every version bit for bit
    started_replay_ns = time.time_ns()
    replayed = subprocess.run([sys.executable, "-m", "actors.cli", "replay", str(run), f"model.path={tiny_model_dir}",
                               "--eval", str(version)], capture_output=True, text=True, timeout=400)
    assert replayed.returncode == 0, replayed.stderr[-3000:]
    assert f"versions 0..{checkpointed_version(run)} replayed, digests_equal=1.000" in replayed.stdout, replayed.stdout
    # --eval: the replayed policy at the resume's version, played by the run's own evaluation
    result = json.loads(next((run / "replays").glob("*/result.json")).read_text())
    evaluation = result["evaluations"][0]
    assert evaluation["version"] == version and 0.0 <= evaluation["recorded"]["nonloss"] <= 1.0, evaluation
    evaluated = load_file(Path(evaluation["recorded"]["policy"]) / "model.safetensors")
    recorded = next(e for e in read_ledger(ledger_path(run / "episodes", "main")) if e["version"] == version
                    and e["kind"] == "update")
    assert weights_digest(evaluated) == recorded["digest"]  # the policy evaluated is the one the run had
    written = {p.relative_to(run).parts[0] for p in run.rglob("*") if p.stat().st_mtime_ns > started_replay_ns}
    assert written <= {"replays"}, written  # a replay writes nothing into the run it reads


def test_resume_names_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        load_config([f"resume={tmp_path}"])
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        load_config([f"resume={tmp_path}"])


def test_a_checkpoint_cut_short_by_a_kill_leaves_the_previous_one(tmp_path):
    # _save renames policy -> policy.old before it renames policy.new -> policy: killed between the two,
    # the previous checkpoint is still whole.
    old = tmp_path / "policy.old"
    old.mkdir()
    (old / TRAINER_STATE).write_bytes(b"")
    (tmp_path / "policy.new").mkdir()
    assert find_checkpoint(tmp_path / "policy") == old
    (tmp_path / "policy").mkdir()
    assert find_checkpoint(tmp_path / "policy") == old  # an empty directory is not a checkpoint
    assert find_checkpoint(None) is None
