"""A short run across three Ray nodes on one machine, each at its own loopback address, with CURVE keys; the
learner's node has two (fake) GPUs and the learner two ranks, a GPU each.

    python -m tests.system.cluster_run <model dir> <work dir>

Run by ``test_cluster.py`` in a process of its own, with ``RAY_TMPDIR`` set to a directory of its own: Ray's
``Cluster`` writes its address where a plain ``ray.init()`` looks for one, so in a shared process (or a shared
temp dir) it would capture the test session's Ray instance or another user's. Writes ``<work dir>/cluster.json``:
each actor's node and bound addresses, the rollout actor's statistics and the run's summary.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

from actors.runs.driver import Driver
from streams.security import CurveKeys
from tests.factories import small_config

# node address -> the custom resource that pins actors to it; 127.0.0.1 itself Ray would replace by the
# machine's outside address, so the head takes 127.0.0.2
NODES = {"127.0.0.2": "head", "127.0.0.3": "node-a", "127.0.0.4": "node-b"}
FAKE_GPUS = 2
PLACEMENT = {"env": "head", "reward": "head", "learner": "node-a", "replay": "node-a", "rollout": "node-b"}


def start_cluster() -> Cluster:
    (head, head_resource), *workers = NODES.items()
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "node_ip_address": head, "resources": {head_resource: 100}, "include_dashboard": False})
    for address, resource in workers:
        gpus = FAKE_GPUS if resource == PLACEMENT["learner"] else 0  # Ray's own count: no CUDA behind it
        cluster.add_node(num_cpus=0, num_gpus=gpus, node_ip_address=address, resources={resource: 100})
    ray.init(address=cluster.address, _node_ip_address=head, logging_level=logging.WARNING)
    return cluster


def main(model_dir: str, work_dir: str) -> None:
    work = Path(work_dir)
    keys = work / "keys"
    CurveKeys.create(str(keys))
    cluster = start_cluster()
    try:
        placement = {f"+ray.resources.{kind}": f"{{{resource}: 1}}" for kind, resource in PLACEMENT.items()}
        cfg = small_config(work, **{"model.path": model_dir, "run.max_versions": 3, "run.minutes": 3,
                                    "run.log_every_s": 0.5, "ray.host": "node", "ray.curve_dir": str(keys),
                                    "learner.ranks": 2,
                                    # the weights cross nodes as they would cross machines: in chunks over ZeroMQ
                                    "rollout.args.weights_shared_memory": False, **placement})
        run, last = Driver(cfg), {}
        snapshot = run.metrics.snapshot

        def keep_stats(stats: dict, *args, **kwargs):  # every actor's statistics, as the run last saw them
            last.update(stats)
            return snapshot(stats, *args, **kwargs)

        run.metrics.snapshot = keep_stats
        summary = run.execute()
        result = {"summary": summary, "bound": {name: spec[3] for name, spec in run.cluster.specs.items()},
                  "stats": last, "ray_nodes": sorted(n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]),
                  "node_addresses": {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()},
                  "placement_groups": list(ray.util.placement_group_table().values())}
        (work / "cluster.json").write_text(json.dumps(result, indent=2, default=str))
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:3])
