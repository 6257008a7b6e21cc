"""Scaling on the real path (Ray actors, ZeroMQ streams). With autoscaling on, a run whose rollout actors are
bound by generation latency (``rollout.args.latency_s``), not by CPU, adds a rollout actor as requests queue
up, and the joining actor answers its share of the requests (how episodes/s rises, 1 -> 2 -> 4 actors, is
`benchmarks/scaling.py`'s measure). Env actors scaled
2 -> 3 -> 1 by command share the admission allowance again each time: at eta = 0 every batch stays on-policy,
training goes on, and every episode is accounted for by id."""

import json

import pytest

from actors.runs.control import send_scale
from actors.models.checkpoints import checkpoint_cursor
from actors.runs.driver import Driver
from actors.replay.spill import account_episodes
from tests.factories import wait_for
from tests.factories import BackgroundRun, small_config

pytestmark = pytest.mark.ray
SETTLE_S = 3.0  # after the joining actor took work, before its phase is measured


def test_autoscaling_adds_a_rollout_actor_that_shares_the_requests_of_a_latency_bound_task(
        ray_session, tiny_model_dir, tmp_path):
    # one actor answers at most 2 requests per 0.25 s; 8 episodes in flight keep 2 actors' batches full
    cfg = small_config(tmp_path, **{
        "model.path": tiny_model_dir, "run.minutes": 1.0, "run.max_versions": 20, "run.log_every_s": 1,
        "rollout.count": 1, "rollout.args.latency_s": 0.25, "rollout.args.max_batch": 2,
        "rollout.autoscale.enabled": True, "rollout.autoscale.max_actors": 2, "rollout.autoscale.queue_high": 2,
        "rollout.autoscale.patience": 8, "rollout.autoscale.idle_above": 0.95})
    run = Driver(cfg)
    summary = run.execute()
    events = summary["scale_events"]
    assert [(e["from"], e["to"]) for e in events] == [(1, 2)] and "applied" in events[0], events
    rows = [json.loads(line) for line in (tmp_path / "test" / "metrics.jsonl").read_text().splitlines()]
    training = [r for r in rows if r["time"] >= run.started and "evaluation" not in r]
    assert training[0]["rollout_actors"] == 1 and training[-1]["rollout_actors"] == 2
    # the queue that asked for it: above queue_high (2 per actor) in the rows before the step
    asked = [r["queue_requests"] for r in training if r["time"] < events[0]["time"]][-8:]
    assert len(asked) == 8 and min(asked) > 2, asked
    # after the step the joining actor takes its share of the requests: each actor answers at most max_batch per
    # latency_s, so with the queue full they share about evenly (how much episodes/s rises is benchmarks/scaling.py's
    # measure, not a test's: on 2 shared cores a rate is noise-prone)
    after = [r for r in training if r["time"] >= events[0]["applied"] + SETTLE_S]
    assert len(after) >= 2, training
    answered = {name: after[-1]["rollout_requests"][name] - after[0]["rollout_requests"].get(name, 0)
                for name in after[-1]["rollout_requests"]}
    assert sorted(answered) == ["rollout-0", "rollout-1"] and min(answered.values()) > 0, answered
    assert answered["rollout-1"] >= 0.3 * sum(answered.values()), answered


def test_env_actors_scaled_2_to_3_to_1_keep_eta_0_on_policy_and_lose_nothing(ray_session, tiny_model_dir, tmp_path):
    cfg = small_config(tmp_path, **{"model.path": tiny_model_dir, "run.minutes": 5, "run.log_every_s": 0.5,
                                    "learner.max_staleness": 0, "env.count": 2, "learner.checkpoint_every": 1,
                                    "run.ledger": True})
    background = BackgroundRun(cfg)
    run = background.run

    def version() -> int:
        return background.last_row({"version": 0})["version"]

    try:
        wait_for(lambda: version() >= 2, "training", timeout=240)
        for step, count in enumerate([3, 1]):
            answer = send_scale(run.dir, "env", count)  # as `tidal scale env=N` does
            assert answer.ok, answer.message
            wait_for(lambda: len(run.scaler.events) > step and "applied" in run.scaler.events[step], "the scale",
                     timeout=240)
            applied_at = version()
            wait_for(lambda: version() >= applied_at + 3, "training to go on after the scale", timeout=240)
    finally:
        run.stop()
        summary = background.join(timeout=400)
    assert [(e["kind"], e["from"], e["to"]) for e in summary["scale_events"]] == [("env", 2, 3), ("env", 3, 1)]
    assert run.top.envs == ["env-0"] and summary["final_nonloss"] is not None
    assert set(summary["staleness_hist"]) == {"0"}, summary["staleness_hist"]  # eta = 0: on-policy throughout
    counts = [r["env_actors"] for r in background.rows()]
    assert [n for i, n in enumerate(counts) if i == 0 or counts[i - 1] != n] == [2, 3, 1], counts
    ledgers = tmp_path / "test" / "ledger" / summary["life"]
    assert (ledgers / "env-2.txt").read_text().split()  # the joining actor played and delivered
    accounts = account_episodes(tmp_path / "test", summary["life"],
                                checkpoint_cursor(tmp_path / "test" / "policy", summary["life"]))
    assert accounts["lost"] == 0 and accounts["duplicated"] == 0, accounts
    assert accounts["consumed"] >= 8 * 8 and accounts["unledgered"] <= 8, accounts  # at most env-0's slots at the end


def test_the_run_goes_on_while_leaving_env_actors_finish_their_episodes(ray_session, tiny_model_dir, tmp_path):
    """Every generation takes a second (``latency_s``), so a TicTacToe episode takes several: the leaving env
    actor needs seconds to deliver what it started, and meanwhile the run's loop goes on writing its metrics.
    A wide staleness bound keeps admission open, so the leaving actor always has its four episodes in flight (with
    the default bound it could be waiting on admission when told to leave, with nothing to finish)."""
    cfg = small_config(tmp_path, **{"model.path": tiny_model_dir, "run.minutes": 5, "run.log_every_s": 0.25,
                                    "env.count": 2, "rollout.args.latency_s": 1.0, "env.args.concurrency": 4,
                                    "learner.max_staleness": 16})
    background = BackgroundRun(cfg)
    run = background.run
    try:
        wait_for(lambda: background.last_row({"version": 0})["version"] >= 1, "training", timeout=240)
        wait_for(lambda: run.cluster.statistics("env-1")["training_in_flight"] >= 4, "the leaving actor's episodes")
        assert send_scale(run.dir, "env", 1).ok
        wait_for(lambda: run.scaler.events and "applied" in run.scaler.events[0], "the scale", timeout=240)
    finally:
        run.stop()
        summary = background.join(timeout=400)
    event = summary["scale_events"][0]
    during = [r for r in background.rows() if event["time"] < r["time"] < event["applied"]]
    assert event["applied"] - event["time"] > 1.0 and len(during) >= 3, (event, len(during))
    assert {r["env_actors"] for r in during} == {2}  # the leaving one still counted until it was stopped
    assert background.rows()[-1]["env_actors"] == 1 and run.top.envs == ["env-0"]


def test_a_league_members_rollout_actors_scale_by_command(ray_session, tiny_model_dir, tmp_path):
    """One driver for both run kinds: ``tidal scale rollout-<member>=N`` reaches a league run too, and the joining
    rollout actor serves that member's requests (and only that member's group grows)."""
    from actors.cli import load_config

    cfg = load_config([f"model.path={tiny_model_dir}", f"run.dir={tmp_path}", "run.name=test", "run.minutes=3",
                       "run.log_every_s=0.5", "league.members=[{id: main, role: main}, {id: rival, role: main}]",
                       "replay.args.batch_episodes=8", "replay.args.capacity_episodes=16", "env.args.concurrency=8",
                       "eval.opponents=[random]", "eval.games_per_seat=1", "eval.endpoint_games_per_seat=1",
                       "eval.every_s=0", "sampling.max_new_tokens=4"], "league")
    background = BackgroundRun(cfg)
    run = background.run
    try:
        wait_for(lambda: background.last_row({}).get("matches", 0) > 0, "the league to play its first matches")
        with pytest.raises(ValueError, match="cannot scale 'rollout-nobody'"):
            run.scale("rollout-nobody", 2)
        with pytest.raises(ValueError, match="a league's env actors cannot be scaled"):
            run.scale("env", 2)
        answer = send_scale(run.dir, "rollout-rival", 2)
        assert answer.ok and answer.actors == 1, answer
        wait_for(lambda: run.top.groups["rival"].rollouts == ["rollout-rival-0", "rollout-rival-1"],
                 "the rival's second rollout actor to join")
        wait_for(lambda: run.cluster.statistics("rollout-rival-1")["requests"] > 0, "it to serve the rival's moves")
        assert run.top.groups["main"].rollouts == ["rollout-main-0"]
        assert run.cluster.specs["rollout-rival-1"][1].policy_id == "rival"  # its config: the rival's weights
    finally:
        run.stop()
    summary = background.join(timeout=300)
    assert summary is not None and not summary["interrupted"]
    assert [(e["kind"], e["from"], e["to"]) for e in summary["scale_events"]] == [("rollout-rival", 1, 2)]
