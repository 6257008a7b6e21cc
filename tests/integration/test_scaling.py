"""Scaling on a latency-bound task, on the real path (Ray actors, ZeroMQ streams): with autoscaling on, a run
whose rollout actors are bound by generation latency (``rollout.args.latency_s``), not by CPU, adds a rollout
actor as requests queue up, and its episodes/s rises with it. (`benchmarks/scaling.py` measures 1 -> 2 -> 4.)"""

import json

import pytest

from actors.monitor import episodes_per_s
from actors.run import Run
from tests.integration.topology import small_config

pytestmark = pytest.mark.ray
SETTLE_S = 3.0  # after the joining actor took work, before its phase is measured


def test_autoscaling_adds_a_rollout_actor_and_raises_episodes_per_s_on_a_latency_bound_task(
        ray_session, tiny_model_dir, tmp_path):
    # one actor answers at most 2 requests per 0.25 s; 8 episodes in flight keep 2 actors' batches full
    cfg = small_config(tmp_path, **{
        "model.path": tiny_model_dir, "run.minutes": 1.0, "run.max_versions": 20, "run.log_every_s": 1,
        "rollout.count": 1, "rollout.args.latency_s": 0.25, "rollout.args.max_batch": 2,
        "rollout.autoscale.enabled": True, "rollout.autoscale.max_actors": 2, "rollout.autoscale.queue_high": 2,
        "rollout.autoscale.patience": 8, "rollout.autoscale.idle_above": 0.95})
    run = Run(cfg)
    summary = run.execute()
    events = summary["scale_events"]
    assert [(e["from"], e["to"]) for e in events] == [(1, 2)] and "applied" in events[0], events
    rows = [json.loads(line) for line in (tmp_path / "test" / "metrics.jsonl").read_text().splitlines()]
    training = [r for r in rows if r["time"] >= run.started and "evaluation" not in r]
    assert training[0]["rollout_actors"] == 1 and training[-1]["rollout_actors"] == 2
    # the queue that asked for it: above queue_high (2 per actor) in the rows before the step
    asked = [r["queue_requests"] for r in training if r["time"] < events[0]["time"]][-8:]
    assert len(asked) == 8 and min(asked) > 2, asked
    one = episodes_per_s(rows, run.started + SETTLE_S, events[0]["time"])
    two = episodes_per_s(rows, events[0]["applied"] + SETTLE_S, training[-1]["time"])  # to the end of training
    assert one and two and two > 1.3 * one, (one, two)
