"""The in-process mode: every actor on one trio loop, with in-memory channels or real ZeroMQ sockets."""

import time

import pytest

from actors.runs.host import LocalCluster
from actors.runs.topology import build_topology
from actors.observe.monitor import MetricsLog
from tests.factories import small_config
from tests.factories import wait_for



@pytest.mark.parametrize("transport", ["memory", "zmq"])
def test_episodes_flow_and_rollouts_generate_with_new_weights(transport, tiny_model_dir, tmp_path):
    # a linear learning-rate decay over a budget of 10 updates: the launcher hands the learner the run's budget
    cfg = small_config(tmp_path, **{"learner.args.lr_decay": "linear", "run.max_versions": 10, "run.minutes": 1000})
    cluster = LocalCluster(transport=transport)
    try:
        top = build_topology(cluster, cfg, tiny_model_dir, tmp_path)
        cluster.call(top.envs[0], "set_training", True)
        wait_for(lambda: cluster.statistics("learner")["version"] >= 3, "three learner updates")
        wait_for(lambda: cluster.statistics(top.groups["main"].rollouts[0])["version"] >= 2, "the rollout to load new weights")
        learner = cluster.statistics("learner")
        assert learner["episodes"] >= 3 * 8 and learner["tokens"] > 0
        # tokens generated after an update carry the new version, and the learner trains on them
        wait_for(lambda: cluster.statistics("learner")["last"]["token_version_max"] >= 1,
                 "a batch generated with updated weights")
        env = cluster.statistics(top.envs[0])
        assert env["episodes"] >= learner["episodes"]
        lr, last = cfg.learner.args.lr, cluster.statistics("learner")["last"]
        assert last["lr"] == pytest.approx(lr * (1 - 0.9 * (last["version"] - 1) / 10), rel=0.01)
        assert all(cluster.statistics(name)["dropped_frames"] == 0 for name in top.names())
        row = MetricsLog(tmp_path).snapshot({name: cluster.statistics(name) for name in top.names()})
        assert row["streams_received"] > 0 and row["streams_sent"] > 0  # stream statistics reach the metrics
        assert row["streams_dropped"] == row["streams_duplicates"] == 0
    finally:
        cluster.shutdown()


def test_admission_bounds_staleness(tiny_model_dir, tmp_path):
    """With eta = 1 no env actor runs ahead of the learner, and no trained token is more than one version old.

    Admission bounds how many episodes run ahead; an episode that finishes late can still fall behind,
    and the learner's filter drops it (counted in ``rejected_episodes``).
    """
    cfg = small_config(tmp_path, **{"learner.max_staleness": 1, "env.args.concurrency": 32})
    cluster = LocalCluster()
    try:
        top = build_topology(cluster, cfg, tiny_model_dir, tmp_path)
        cluster.call(top.envs[0], "set_training", True)
        while (learner := cluster.statistics("learner"))["version"] < 6:
            env = cluster.statistics(top.envs[0])
            assert env["started"] <= env["admission_limit"]
            time.sleep(0.05)
        assert env["admission_waits"] > 0  # generation is faster than learning here: admission had to hold it
        assert set(learner["staleness_hist"]) <= {"0", "1"}
        assert learner["rejected_episodes"] < learner["episodes"] / 4
    finally:
        cluster.shutdown()


@pytest.mark.parametrize("transport", ["memory", "zmq"])
def test_eta_zero_is_exactly_on_policy(transport, tiny_model_dir, tmp_path):
    """max_staleness = 0: every token of every batch was sampled by the learner's current weights.

    Two env actors and two rollout actors, so admission is shared and weights reach several rollouts.
    Nothing is rejected: the guarantee comes from admission and min_version, not from the filter.
    """
    cfg = small_config(tmp_path, **{"learner.max_staleness": 0, "env.count": 2, "rollout.count": 2,
                                    "replay.args.batch_episodes": 6, "env.args.concurrency": 16})
    cluster = LocalCluster(transport=transport)
    try:
        top = build_topology(cluster, cfg, tiny_model_dir, tmp_path)
        for env in top.envs:
            cluster.call(env, "set_training", True)
        learner = wait_for(lambda: (s := cluster.statistics("learner"))["version"] >= 6 and s, "six updates")
        trained_tokens = learner["tokens"]
        assert learner["staleness_hist"] == {"0": trained_tokens} and trained_tokens > 0
        assert learner["rejected_episodes"] == 0
        assert sum(cluster.statistics(env)["started"] for env in top.envs) <= (learner["version"] + 1) * 6
    finally:
        cluster.shutdown()
