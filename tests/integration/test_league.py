"""A Liar's Dice league of three players over real ZeroMQ sockets, killed with SIGKILL and resumed with its
ratings, snapshots and match count intact; then `tidal league table` on it. (The quick league benchmark runs
the Kuhn Poker league on Ray: tests/integration/test_benchmarks_quick.py.)"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from actors.learner import find_checkpoint


def league_state(run):
    try:
        return json.loads((run / "league" / "league_state.json").read_text())
    except (OSError, ValueError):
        return None


@pytest.mark.timeout(600)
def test_a_killed_three_player_league_resumes_with_its_ratings(tiny_model_dir, tmp_path):
    run = tmp_path / "dice"
    first = [f"model.path={tiny_model_dir}", f"run.dir={tmp_path}", "run.name=dice", "run.mode=local",
             "run.local_transport=zmq", "run.minutes=5", "run.log_every_s=0.5", "env=liars_dice", "league=liars_dice",
             "env.args.env_args.players=3", "league.args.players=3", "replay.args.batch_episodes=8",
             "replay.args.capacity_episodes=16", "env.args.concurrency=8", "eval.opponents=[random]",
             "eval.games_per_seat=2", "eval.endpoint_games_per_seat=2", "eval.every_s=0", "learner.checkpoint_every=1",
             "league.args.snapshot_every_versions=2", "league.args.save_every_s=0.5",
             "league.args.history_every_matches=5", "sampling.max_new_tokens=8"]
    process = subprocess.Popen([sys.executable, "-m", "actors.cli", "league", "run", *first],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 400

    def ready():
        state = league_state(run)
        checkpoints = all(find_checkpoint(run / "members" / m / "policy") for m in ("main", "leaguex"))
        return state is not None and checkpoints and state["snapshots"] and len(state["history"]) >= 2

    while not ready():
        assert process.poll() is None, process.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "the league stalled before it saved matches, checkpoints and a snapshot"
        time.sleep(0.2)
    os.kill(process.pid, signal.SIGKILL)
    process.communicate(timeout=60)
    killed = league_state(run)
    assert killed["members"] == [{"id": "main", "role": "main"}, {"id": "leaguex", "role": "league_exploiter"}]
    assert len(killed["ratings"]) >= 3  # three seats: the learner and two opponents rated at once

    target = killed["stats"]["matches"] + 20
    resumed = subprocess.run([sys.executable, "-m", "actors.cli", "league", "run", f"resume={run}",
                              f"run.max_matches={target}", "run.minutes=4"], capture_output=True, text=True, timeout=400)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"league resumed: {killed['stats']['matches']} matches" in resumed.stderr
    final = league_state(run)
    assert final["history"][:len(killed["history"])] == killed["history"]  # the ratings' past, as it was
    assert final["stats"]["matches"] >= target and final["stats"]["errored_matches"] == 0
    assert set(killed["snapshots"]) <= set(final["snapshots"])
    assert final["next_match"] > killed["next_match"]
    summary = json.loads((run / "summary.json").read_text())
    assert {e["tag"] for e in summary["evaluations"]} == {"resume-main-random", "final-main-random"}

    table = subprocess.run([sys.executable, "-m", "actors.cli", "league", "table", str(run)], capture_output=True,
                           text=True, timeout=120)
    assert table.returncode == 0, table.stderr[-2000:]
    assert "payoff" in table.stdout and "main" in table.stdout and (run / "league" / "ratings.png").stat().st_size > 0
    missing = subprocess.run([sys.executable, "-m", "actors.cli", "league", "table", str(tmp_path)],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "not a league run directory" in missing.stderr
