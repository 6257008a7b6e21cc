"""The real topology: every actor a Ray actor in its own process, streams over ZeroMQ sockets."""

import pytest
import zmq

from actors.runs.ray_cluster import RayCluster
from actors.runs.topology import build_topology
from streams.wire import FrameCounter, Kind, LinkType, encode_link
from tests.factories import wait_for
from tests.factories import small_config

pytestmark = pytest.mark.ray


def test_real_topology_learns_from_its_own_episodes(ray_session, tiny_model_dir, tmp_path):
    cfg = small_config(tmp_path, **{"rollout.count": 2})
    cluster = RayCluster()
    try:
        top = build_topology(cluster, cfg, tiny_model_dir, tmp_path)
        cluster.call(top.envs[0], "set_training", True)
        wait_for(lambda: cluster.statistics("learner")["version"] >= 3, "three learner updates")
        for rollout in top.groups["main"].rollouts:
            wait_for(lambda: cluster.statistics(rollout)["version"] >= 1, f"{rollout} to load published weights")
        wait_for(lambda: cluster.statistics("learner")["last"]["token_version_max"] >= 1,
                 "a batch generated with updated weights")
        assert all(cluster.statistics(r)["requests"] > 0 for r in top.groups["main"].rollouts), "requests are spread over rollouts"
        learner = cluster.statistics("learner")
        assert learner["episodes"] >= 3 * 8 and cluster.statistics("replay")["episodes_in"] >= learner["episodes"]
        bound = [address for spec in cluster.specs.values() for address in spec[3]]  # one host: no TCP port
        assert bound and all(a.startswith(f"ipc://{cluster.ipc_dir}/") for a in bound), bound
    finally:
        cluster.shutdown()


def test_malformed_frames_are_dropped_and_counted(ray_session, tiny_model_dir, tmp_path):
    cluster = RayCluster()
    try:
        from actors.reward.actor import RewardActor, RewardConfig

        replay_inbox = zmq.Context.instance().socket(zmq.PULL)
        port = replay_inbox.bind_to_random_port("tcp://127.0.0.1")
        address = cluster.spawn("reward", RewardActor, RewardConfig(), peers={"replay": [f"tcp://127.0.0.1:{port}"]})
        peer = zmq.Context.instance().socket(zmq.DEALER)  # speaks the link protocol, then sends bad frames
        peer.connect(address["episodes"])
        frames = FrameCounter("intruder")
        bad = [[b"not msgpack", b"x"],  # bad header
               frames.frame(Kind.EPISODES, b"not arrow"),  # bad body
               frames.frame(Kind.WEIGHTS, b""),  # wrong kind for this stream
               [b"one part only"]]
        for seq, parts in enumerate(bad):
            peer.send_multipart([encode_link(LinkType.DATA, seq), *parts])
        peer.send_multipart([b"no link envelope", b"x"])
        wait_for(lambda: cluster.statistics("reward")["dropped_frames"] == 4, "four dropped frames")
        episodes = cluster.statistics("reward")["streams"]["episodes"]
        assert episodes["dropped"] == 1 and episodes["received"] == 4
        assert cluster.statistics("reward")["episodes"] == 0  # and the actor still answers
        peer.close(0)
        replay_inbox.close(0)
    finally:
        cluster.shutdown()


def test_a_single_agent_task_with_slow_tools_trains_on_ray(ray_session, tiny_model_dir, tmp_path):
    """The tool-latency task hosted by a Ray env actor, over ZeroMQ, feeding a learner."""
    cfg = small_config(tmp_path, env="tool_latency", **{"env.args.env_args.latency_median_s": 0.01,
                                                        "env.args.env_args.min_new_tokens": 2,
                                                        "env.args.env_args.max_new_tokens": 6})
    cluster = RayCluster()
    try:
        top = build_topology(cluster, cfg, tiny_model_dir, tmp_path)
        cluster.call(top.envs[0], "set_training", True)
        wait_for(lambda: cluster.statistics("learner")["version"] >= 2, "two learner updates")
        env = cluster.statistics(top.envs[0])
        assert env["episodes"] >= 16 and env["errored"] == 0 and env["turns"] >= env["episodes"]
        assert cluster.statistics("learner")["episodes"] >= 16
    finally:
        cluster.shutdown()
