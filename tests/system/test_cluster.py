"""Across machines: a run's actors on three Ray nodes (one machine, three loopback addresses), each binding its
streams on its own node's address (``ray.host=node``), with CURVE keys; episodes flow end to end, and the
rollout actor takes the learner's weights in chunks over ZeroMQ, not from its shared-memory file.

The run happens in a process of its own (``cluster_run.py``), with a Ray temp dir of its own, so that its
``Cluster`` cannot capture the session's Ray instance (the ``ray_session`` fixture) or anyone else's."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.system.cluster_run import FAKE_GPUS, NODES, PLACEMENT

pytestmark = pytest.mark.ray
ROOT = Path(__file__).resolve().parents[2]


def test_actors_on_three_nodes_connect_across_their_addresses_and_learn(tiny_model_dir, tmp_path):
    pytest.importorskip("ray")
    # a short temp dir: Ray's unix sockets live under it, and their paths have a length limit
    with tempfile.TemporaryDirectory(prefix="tc-", dir="/tmp") as ray_tmp:
        env = {**os.environ, "RAY_TMPDIR": ray_tmp}
        env.pop("RAY_ADDRESS", None)
        done = subprocess.run([sys.executable, "-m", "tests.system.cluster_run", str(tiny_model_dir),
                               str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads((tmp_path / "cluster.json").read_text())
    assert result["ray_nodes"] == sorted(NODES)
    node_of = {resource: address for address, resource in NODES.items()}
    for name, addresses in result["bound"].items():  # every stream bound on the node its actor was placed on
        host = node_of[PLACEMENT[name.split("-")[0]]]
        if name == "learner-rank1":  # a learner rank has no streams: it meets rank 0 in torch.distributed
            continue
        assert addresses and all(a.startswith(f"tcp://{host}:") for a in addresses), (name, addresses)
    summary, rollout = result["summary"], result["stats"]["rollout-0"]
    # env (127.0.0.2) -> rollout (127.0.0.4) -> env; env -> reward -> replay (127.0.0.3) -> learner: it trained
    assert summary["final_version"] >= 3 and summary["episodes"] > 0 and summary["final_nonloss"] is not None
    # learner (127.0.0.3) -> rollout (127.0.0.4): the rollout actor generates with the learner's new weights
    assert rollout["version"] >= 2 and rollout["weights_applied"] >= 1 and rollout["requests"] > 0
    # ... fetched in checked chunks over ZeroMQ across the nodes' addresses, as between machines
    assert rollout["weights"]["from_chunks"] >= 2 and rollout["weights"]["from_shared_memory"] == 0
    assert result["stats"]["learner"]["episodes"] > 0 and summary["restarts"] == {}
    # the learner group: one placement group, a (fake) GPU per rank, both on the learner's node
    group, = result["placement_groups"]
    assert [b for b in group["bundles"].values()] == [{"GPU": 1.0, PLACEMENT["learner"]: 1.0}] * FAKE_GPUS
    assert {result["node_addresses"][n] for n in group["bundles_to_node_id"].values()} == {node_of["node-a"]}
    assert result["stats"]["learner-rank1"]["state"] == "serving"
