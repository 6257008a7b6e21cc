"""The 0.5B shape (Qwen2-0.5B's, random-init) through the whole job on the CPU: one full update.

Slow (several minutes on two cores, about 12 GiB): ``pytest -m slow tests/system/test_real_shape.py``."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_qwen2_0_5b_shape_makes_one_full_update_through_tidal_launch_in_local_mode(tmp_path):
    overrides = ["model=qwen2_0_5b", f"model.cache_dir={tmp_path / 'models'}", "model.shape.tokenizer_env=builtin",
                 "run.mode=local", "run.max_versions=1", "run.minutes=30", f"run.dir={tmp_path}", "run.name=big",
                 "run.progress=false", "replay.args.batch_episodes=4", "replay.args.capacity_episodes=8",
                 "env.args.concurrency=4", "eval.every_s=0", "eval.games_per_seat=1",
                 "eval.endpoint_games_per_seat=1", "sampling.max_new_tokens=4", "learner.checkpoint_every=0",
                 "learner.args.max_tokens_per_microbatch=256", "learner.args.threads=2", "rollout.args.threads=2"]
    done = subprocess.run([sys.executable, "-c", "import sys; from actors.cli import main; sys.exit(main())",
                           "launch", *overrides], cwd=ROOT, capture_output=True, text=True, timeout=3000)
    assert done.returncode == 0, done.stderr[-4000:]
    run = tmp_path / "big"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_version"] >= 1
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if r.get("version", 0) >= 1]
    assert trained and trained[-1]["trained_episodes"] >= 4
    base = json.loads(next((tmp_path / "models").glob("random-qwen2-*/tidal_base_model.json")).read_text())
    assert base["parameters"] > 490e6  # the real shape, not a small stand-in
    assert (run / "policy" / "optimizer").is_dir() and (run / "policy" / "config.json").exists()
