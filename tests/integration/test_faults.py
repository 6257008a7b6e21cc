"""Faults on the real path: a rollout actor killed with SIGKILL mid-run is restarted, and the run goes on."""

import json
import os
import signal
import threading

import pytest

from actors.launcher import launch
from tests.integration.test_local_topology import wait_for
from tests.integration.topology import small_config

pytestmark = pytest.mark.ray


def test_a_killed_rollout_actor_is_restarted_and_its_requests_answered(ray_session, tiny_model_dir, tmp_path):
    cfg = small_config(tmp_path, **{"model.path": tiny_model_dir, "run.max_versions": 8, "run.minutes": 5,
                                    "run.log_every_s": 0.5, "rollout.count": 2})
    outcome = {}
    runner = threading.Thread(target=lambda: outcome.setdefault("summary", launch(cfg)))
    runner.start()
    metrics = tmp_path / "test" / "metrics.jsonl"

    def version() -> int:
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        return json.loads(lines[-1])["version"] if lines else 0

    try:
        killed_at = wait_for(lambda: version() >= 2 and version(), "two learner updates", timeout=300)
        victim = ray_session.get_actor("rollout-0")
        os.kill(ray_session.get(victim.pid.remote()), signal.SIGKILL)
    finally:
        runner.join(timeout=400)
    summary = outcome["summary"]
    assert not summary["interrupted"] and summary["restarts"] == {"rollout-0": 1}
    assert summary["final_version"] >= 8 > killed_at  # learning went on after the kill
    assert summary["final_nonloss"] is not None  # and the final evaluation was played to its end
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    # what the dead actor held is asked again; an answer that comes twice is dropped, not counted twice
    reissued, duplicates = rows[-1]["reissued_requests"], rows[-1]["duplicate_completions"]
    assert reissued > 0 and duplicates <= reissued
    assert rows[-1]["trained_episodes"] == 8 * summary["final_version"] or rows[-1]["rejected_episodes"] > 0
