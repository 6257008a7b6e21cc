"""A Liar's Dice league of three players over real ZeroMQ sockets, its league exploiter reset after each
snapshot, killed with SIGKILL and resumed with its ratings, snapshots and match count intact; then `tidal league
table` on it. Leagues of four and six players on Ray, a main exploiter reset there too (slow: minutes here).
(The quick league benchmark runs the Kuhn Poker league on Ray: tests/system/test_benchmarks_quick.py.)"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from actors.league.actor import JOURNAL_FILE
from actors.models.checkpoint_dir import find_checkpoint


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
             "league.args.history_every_matches=5", "sampling.max_new_tokens=8",
             "league.args.reset_after_snapshot.league_exploiter=1.0"]
    process = subprocess.Popen([sys.executable, "-m", "actors.cli", "league", "run", *first],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 400

    def ready():  # and the league exploiter reset after a snapshot, then trained on
        state = league_state(run)
        checkpoints = all(find_checkpoint(run / "members" / m / "policy") for m in ("main", "leaguex"))
        return (state is not None and checkpoints and state["snapshots"] and len(state["history"]) >= 2
                and state["resets"] and state["versions"]["leaguex"] > state["resets"][0]["version"] + 1)

    while not ready():
        assert process.poll() is None, process.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "the league stalled before it saved matches, checkpoints and a snapshot"
        time.sleep(0.2)
    os.kill(process.pid, signal.SIGKILL)
    process.communicate(timeout=60)
    killed = league_state(run)
    journal = (run / "league" / JOURNAL_FILE).read_text()  # every result taken, saved or not (a torn end cut)
    journaled = [json.loads(line) for line in journal[:journal.rfind("\n") + 1].splitlines()]
    rated = sum(not errored for *_, errored in journaled)
    assert rated >= killed["stats"]["matches"]
    assert killed["members"] == [{"id": "main", "role": "main"}, {"id": "leaguex", "role": "league_exploiter"}]
    assert len(killed["ratings"]) >= 3  # three seats: the learner and two opponents rated at once
    assert {r["member"] for r in killed["resets"]} == {"leaguex"}  # a main agent is never reset

    target = killed["stats"]["matches"] + 20
    resumed = subprocess.run([sys.executable, "-m", "actors.cli", "league", "run", f"resume={run}",
                              f"run.max_matches={target}", "run.minutes=4", f"model.path={tiny_model_dir}"], capture_output=True, text=True, timeout=400)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (f"league resumed: {rated} matches" in resumed.stderr
            and f"({len(journaled) - killed['stats']['results']} results replayed from the journal)" in resumed.stderr)
    final = league_state(run)
    assert final["history"][:len(killed["history"])] == killed["history"]  # the ratings' past, as it was
    assert final["stats"]["matches"] >= target and final["stats"]["errored_matches"] == 0
    assert set(killed["snapshots"]) <= set(final["snapshots"])
    assert final["resets"][:len(killed["resets"])] == killed["resets"]
    assert final["next_match"] > killed["next_match"]
    summary = json.loads((run / "summary.json").read_text())
    assert {e["tag"] for e in summary["evaluations"]} == {"start-main-random", "resume-main-random", "final-main-random"}

    table = subprocess.run([sys.executable, "-m", "actors.cli", "league", "table", str(run)], capture_output=True,
                           text=True, timeout=120)
    assert table.returncode == 0, table.stderr[-2000:]
    assert "payoff" in table.stdout and "main" in table.stdout and (run / "league" / "ratings.png").stat().st_size > 0
    missing = subprocess.run([sys.executable, "-m", "actors.cli", "league", "table", str(tmp_path)],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "not a league run directory" in missing.stderr


def dice_league_on_ray(tiny_model_dir, tmp_path, players: int, max_matches: int, kill: tuple[str, ...] = (),
                       ray=None) -> dict:
    """A Liar's Dice league of ``players`` seats on the session's Ray, a main agent and a main exploiter (reset
    after every snapshot), run to ``max_matches`` rated matches through the driver itself. The actors named in
    ``kill`` are SIGKILLed one after another: the first once the learners have checkpointed and a share of the
    matches is played, each next one once the last is restarted and another share is played."""
    import threading

    from actors.cli import load_config
    from actors.runs.driver import Driver

    cfg = load_config([f"model.path={tiny_model_dir}", f"run.dir={tmp_path}", f"run.name=dice{players}",
                       "run.minutes=6", f"run.max_matches={max_matches}", "run.log_every_s=0.5", "env=liars_dice",
                       "league=liars_dice", f"env.args.env_args.players={players}", f"league.args.players={players}",
                       "league.members=[{id: main, role: main, model: null}, "
                       "{id: exploiter, role: main_exploiter, model: null}]",
                       "replay.args.batch_episodes=4", "replay.args.capacity_episodes=8", "env.args.concurrency=8",
                       "eval.opponents=[random]", "eval.games_per_seat=1", "eval.endpoint_games_per_seat=1",
                       "eval.every_s=0", "learner.checkpoint_every=2", "league.args.snapshot_every_versions=2",
                       "league.args.snapshot_win_rate=null", "sampling.max_new_tokens=8"], "league")
    outcome, run = {}, Driver(cfg)
    runner = threading.Thread(target=lambda: outcome.setdefault("summary", run.execute()))
    runner.start()
    try:
        for k, name in enumerate(kill):
            def ready():
                assert runner.is_alive(), "the league ended early"
                played = run.steward.matches if run.steward is not None else 0  # at the driver's last tick
                return (played >= max_matches * (k + 1) // (len(kill) + 2)
                        and all(find_checkpoint(run.dir / "members" / m / "policy") for m in ("main", "exploiter"))
                        and all(run.restarts.get(earlier) for earlier in kill[:k]))

            while not ready():
                time.sleep(0.2)
            os.kill(ray.get(ray.get_actor(name).pid.remote()), signal.SIGKILL)
    finally:
        runner.join(timeout=800)
    summary = outcome["summary"]
    assert not summary["interrupted"]
    return summary


def check_dice_league(summary: dict, tmp_path, players: int, max_matches: int) -> None:
    import torch

    from actors.models.checkpoint_dir import TRAINER_STATE

    table, run = summary["table"], tmp_path / f"dice{players}"
    assert table["matches"] >= max_matches and table["errored_matches"] == 0
    assert len(table["ratings"]) >= 3  # the members and the snapshots or random they met, rated together
    assert {s["member"] for s in table["snapshots"].values()} == {"main", "exploiter"}
    # the main exploiter was reset after its first snapshot, and trained on after it
    first = min(r["version"] for r in table["resets"] if r["member"] == "exploiter")
    assert all(r["member"] == "exploiter" for r in table["resets"])  # a main agent is never reset
    assert table["versions"]["exploiter"] > first + 1
    learner = torch.load(run / "members" / "exploiter" / "policy" / TRAINER_STATE, weights_only=False)
    assert first + 1 in learner["resets"] and learner["version"] > first + 1
    assert {e["tag"] for e in summary["evaluations"]} == {"start-main-random", "final-main-random"}


@pytest.mark.slow  # these three: 25-35 s each on 2 quiet cores, 1.6 minutes with Ray: over the default suite's budget
@pytest.mark.ray
@pytest.mark.timeout(900)
def test_a_four_player_league_goes_on_after_a_learner_is_killed_and_resets_its_exploiter(ray_session,
                                                                                         tiny_model_dir, tmp_path):
    summary = dice_league_on_ray(tiny_model_dir, tmp_path, players=4, max_matches=400, kill=("learner-main",),
                                 ray=ray_session)
    check_dice_league(summary, tmp_path, players=4, max_matches=400)
    assert summary["restarts"] == {"learner-main": 1}
    metrics = [json.loads(line) for line in (tmp_path / "dice4" / "metrics.jsonl").read_text().splitlines()]
    restarted = next(i for i, row in enumerate(metrics) if row["restarts"])
    assert metrics[-1]["matches"] > metrics[restarted]["matches"]  # the league went on after the restart
    assert metrics[-1]["versions"]["main"] > metrics[restarted]["versions"]["main"]  # and so did its learner


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.timeout(900)
def test_a_league_goes_on_after_its_league_actor_and_an_env_actor_are_killed(ray_session, tiny_model_dir,
                                                                              tmp_path):
    """The league comes back from its saved state with its snapshots and evaluations; the env actor plays on, and
    the matches it was waiting on or playing are asked for again."""
    summary = dice_league_on_ray(tiny_model_dir, tmp_path, players=3, max_matches=600, kill=("league", "env-0"),
                                 ray=ray_session)
    check_dice_league(summary, tmp_path, players=3, max_matches=600)
    assert summary["restarts"] == {"league": 1, "env-0": 1}
    assert summary["league_results_lost"] == 0  # the journal brought back what the league took after its last save
    metrics = [json.loads(line) for line in (tmp_path / "dice3" / "metrics.jsonl").read_text().splitlines()]
    both = next(i for i, row in enumerate(metrics) if row["restarts"] == 2)
    assert metrics[-1]["matches"] > metrics[both]["matches"]  # matches went on after both restarts
    assert metrics[-1]["episodes"] > metrics[both]["episodes"]
    counts = [row["episodes"] for row in metrics]  # the env actor's count goes on over its restart
    assert counts == sorted(counts)
    state = league_state(tmp_path / "dice3")
    assert {e["tag"] for e in state["evaluations"]} == {"start-main-random", "final-main-random"}
    assert set(state["snapshots"]) == set(summary["table"]["snapshots"])


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.timeout(900)
def test_a_six_player_league_runs_on_ray(ray_session, tiny_model_dir, tmp_path):
    summary = dice_league_on_ray(tiny_model_dir, tmp_path, players=6, max_matches=150)
    check_dice_league(summary, tmp_path, players=6, max_matches=150)
