"""The launcher: the one module that knows Ray. It opens the cluster the actors run on.

On one machine it starts an embedded Ray cluster; with ``ray.address`` it attaches to a running one. Each
actor is a plain class; here, and only here, it is wrapped with ``ray.remote``. In local mode the same
actors run on one trio loop in this process instead (``host.LocalCluster``). What runs on the cluster, and
how it is connected, is ``topology.build_topology``'s.
"""

from __future__ import annotations

import dataclasses
import logging

from actors.config import RaySection, RunSection
from actors.host import STOP_TIMEOUT_S, ActorHost, LocalCluster
from streams.security import is_loopback

log = logging.getLogger(__name__)


NODE_HOST = "node"  # ray.host=node: each actor binds on the address Ray reports for the node it landed on


class _NodeActorHost(ActorHost):
    """An ActorHost whose streams bind on its node's address (``ray.host=node``): on a cluster each actor is
    reachable at its own machine's address. Defined here because only the launcher may know Ray."""

    def __init__(self, actor_cls, cfg, name: str, host: str, curve_dir: str | None, rebind: list[str]):
        import ray

        node = ray.util.get_node_ip_address()
        if not is_loopback(node) and not curve_dir:
            raise ValueError(f"{name} landed on node {node}, beyond loopback: ray.host=node needs ray.curve_dir")
        super().__init__(actor_cls, cfg, name, node, curve_dir, rebind)


PLACEMENT_TIMEOUT_S = 120  # a learner group's placement group waits this long for its resources
MIN_CPU_BUNDLE = 0.01  # a bundle cannot be empty: a rank without other needs reserves this much of a CPU


def learner_bundle(wanted: dict, cluster_gpus: float, device: str) -> dict:
    """The resources of one learner rank: ``ray.resources.learner``'s, a GPU where the cluster has some and the
    learner may use one (its ``device`` is not cpu), and a sliver of a CPU if nothing else."""
    bundle = dict(wanted)
    if "GPU" not in bundle and cluster_gpus >= 1 and device != "cpu":
        bundle["GPU"] = 1
    if not any(v > 0 for v in bundle.values()):
        bundle["CPU"] = MIN_CPU_BUNDLE
    return bundle


ACTOR_KINDS = ("learner", "replay", "reward", "rollout", "env", "league")


def actor_kind(name: str) -> str:
    """``rollout-3`` -> ``rollout``, ``learner-m`` -> ``learner``: the key of ``ray.resources``."""
    return name.split("-", 1)[0]


def check_resources(resources: dict) -> dict:
    """``ray.resources``, checked: known actor kinds, each a mapping of resource names to amounts."""
    for kind, wanted in resources.items():
        if kind not in ACTOR_KINDS:
            raise ValueError(f"ray.resources: unknown actor kind {kind!r}; choose among {', '.join(ACTOR_KINDS)}")
        if not isinstance(wanted, dict) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in wanted.values()):
            raise ValueError(f"ray.resources.{kind} must map resource names to amounts >= 0, not {wanted!r}")
    return {kind: dict(wanted) for kind, wanted in resources.items()}


class RayCluster:
    """Actors as Ray actors (one process each), their streams on ZeroMQ.

    ``resources`` maps an actor kind (learner, replay, reward, rollout, env, league) to the Ray resources each
    actor of that kind asks for (``GPU``, or a custom resource a node was started with): Ray then places it on
    a node that has them. ``host="node"`` binds each actor's streams on its own node's address."""

    def __init__(self, address: str | None = None, num_cpus: int | None = None, host: str = "127.0.0.1",
                 curve_dir: str | None = None, resources: dict | None = None):
        import ray

        if host != NODE_HOST and not is_loopback(host) and not curve_dir:  # fail here, before any actor starts
            raise ValueError(f"ray.host={host} binds streams beyond loopback: set ray.curve_dir to the cluster's "
                             "CURVE keys (see README, 'Security')")
        self.resources = check_resources(resources or {})
        self.ray = ray
        self.host, self.curve_dir = host, curve_dir
        self.owns_ray = not ray.is_initialized()
        if self.owns_ray:
            kwargs = {"num_cpus": num_cpus} if address is None else {"address": address}
            ray.init(include_dashboard=False, logging_level=logging.WARNING, **kwargs)
        if host == NODE_HOST and not curve_dir:
            beyond = sorted({n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]
                             and not is_loopback(n["NodeManagerAddress"])})
            if beyond:
                raise ValueError(f"ray.host=node binds streams on the nodes' addresses, {beyond} beyond loopback: "
                                 "set ray.curve_dir to the cluster's CURVE keys (see README, 'Security')")
        self.handles: dict[str, object] = {}
        self.groups: dict[str, tuple] = {}  # actor name -> (placement group, bundle index): a learner group's
        self.specs: dict[str, tuple] = {}  # name -> (class, config, peers, bound addresses): what a restart needs
        # num_cpus=0: actors share the machine's cores; Ray only places and supervises them.
        self._remote_host = ray.remote(num_cpus=0, max_concurrency=4)(
            _NodeActorHost if host == NODE_HOST else ActorHost)

    def _placement(self, name: str) -> dict:
        """Ray options that place ``name`` where ``ray.resources`` says its kind goes (a learner group's ranks:
        in their bundles of the group's placement group)."""
        if name in self.groups:
            group, index = self.groups[name]
            bundle = dict(group.bundle_specs[index])
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            options = {"num_cpus": bundle.pop("CPU", 0), "num_gpus": bundle.pop("GPU", 0),
                       "scheduling_strategy": PlacementGroupSchedulingStrategy(group, index)}
            return {**options, "resources": bundle} if bundle else options
        wanted = dict(self.resources.get(actor_kind(name), {}))
        options = {"num_gpus": wanted.pop("GPU")} if "GPU" in wanted else {}
        if "CPU" in wanted:
            options["num_cpus"] = wanted.pop("CPU")
        return {**options, "resources": wanted} if wanted else options

    def reserve_group(self, names: list[str], device: str = "auto") -> None:
        """A placement group for a learner group's ranks ``names`` (two or more), a bundle each, packed: each bundle
        is what ``ray.resources.learner`` asks for, with a GPU per rank where the cluster has GPUs (unless the
        learner's ``device`` is cpu). A learner of one rank is placed by ``ray.resources.learner`` alone."""
        if len(names) < 2:
            return
        bundle = learner_bundle(self.resources.get("learner", {}), self.ray.cluster_resources().get("GPU", 0),
                                device)
        group = self.ray.util.placement_group([bundle] * len(names), strategy="PACK")
        try:
            self.ray.get(group.ready(), timeout=PLACEMENT_TIMEOUT_S)
        except self.ray.exceptions.GetTimeoutError:
            self.ray.util.remove_placement_group(group)
            raise RuntimeError(f"learner.ranks={len(names)}: the cluster has no room for {len(names)} x {bundle} "
                               f"(it has {self.ray.cluster_resources()}); lower learner.ranks or change "
                               "ray.resources.learner") from None
        self.groups.update({name: (group, i) for i, name in enumerate(names)})

    def spawn(self, name: str, actor_cls, cfg, peers: dict, rebind: list[str] = ()) -> dict:
        return self.spawn_many([(name, actor_cls, cfg, peers)], rebind)[0]

    def spawn_many(self, actors: list[tuple], rebind: list[str] = ()) -> list[dict]:
        """Start ``(name, class, config, peers)`` actors side by side (their processes load at once); their
        addresses, in order."""
        starting = []
        for name, actor_cls, cfg, peers in actors:
            handle = self._remote_host.options(name=name, **self._placement(name)).remote(
                actor_cls, cfg, name, self.host, self.curve_dir, rebind)
            self.handles[name] = handle
            starting.append(handle.start.remote(peers))
        addresses = self.ray.get(starting)
        for name, actor_cls, cfg, peers in actors:
            self.specs[name] = (actor_cls, cfg, peers, self.ray.get(self.handles[name].bound.remote()))
        return addresses

    def restart(self, name: str, **changes) -> dict:
        """Start a dead actor again, with its config (``changes`` replaced) and peers, at its old addresses
        (those who send to it reconnect by themselves and send again what it had not acknowledged)."""
        actor_cls, cfg, peers, bound = self.specs[name]
        self.ray.kill(self.handles.pop(name), no_restart=True)  # if it is not quite dead yet
        return self.spawn(name, actor_cls, dataclasses.replace(cfg, **changes), peers, rebind=bound)

    def stop(self, name: str) -> None:
        """Stop one actor (scale-down): its loop is cancelled, then its process ends."""
        handle = self.handles.pop(name)
        self.specs.pop(name)
        try:
            self.ray.get(handle.stop.remote(), timeout=30)
        except Exception as error:  # a dead actor cannot stop; it is gone all the same
            log.warning("%s did not stop cleanly: %s", name, error)
        self.ray.kill(handle)

    def set_peers(self, name: str, key: str, addresses: list[str], member: str | None = None) -> None:
        """What a restart of ``name`` connects to under ``key`` (and ``member``, where its peers of ``key`` are
        per member) from now on: the rollout actors after a scale."""
        peers = self.specs[name][2]
        if member is None:
            peers[key] = list(addresses)
        else:
            peers[key][member] = list(addresses)

    def reconfigure(self, name: str, **changes) -> None:
        """What a restart of ``name`` starts with from now on (an env actor's admission share after a scale)."""
        actor_cls, cfg, peers, bound = self.specs[name]
        self.specs[name] = (actor_cls, dataclasses.replace(cfg, **changes), peers, bound)

    def is_dead(self, error: Exception) -> bool:
        return isinstance(error, self.ray.exceptions.RayActorError)

    def call(self, name: str, method: str, *args):
        return self.ray.get(self.handles[name].call.remote(method, *args))

    def statistics(self, name: str) -> dict:
        return self.ray.get(self.handles[name].statistics.remote())

    def shutdown(self) -> None:
        stops = [handle.stop.remote() for handle in self.handles.values()]
        try:
            self.ray.get(stops, timeout=STOP_TIMEOUT_S)
        except Exception as error:  # an actor that already died cannot stop; say so and go on
            log.warning("not every actor stopped cleanly: %s", error)
        for handle in self.handles.values():
            self.ray.kill(handle)
        if self.owns_ray:
            self.ray.shutdown()


def open_cluster(run: RunSection, ray: RaySection):
    """The cluster ``run.mode`` names: Ray (embedded, or ``ray.address``'s), or one trio loop in this process."""
    if run.mode == "local":
        return LocalCluster(transport=run.local_transport)
    if run.mode != "ray":
        raise ValueError(f"run.mode must be 'ray' or 'local', not {run.mode!r}")
    return RayCluster(address=ray.address, num_cpus=ray.num_cpus, host=ray.host, curve_dir=ray.curve_dir,
                      resources=ray.resources)
