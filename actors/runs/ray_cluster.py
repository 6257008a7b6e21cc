"""The launcher: the one module that knows Ray. It opens the cluster the actors run on.

On one machine it starts an embedded Ray cluster; with ``ray.address`` it attaches to a running one. Each
actor is a plain class; here, and only here, it is wrapped with ``ray.remote``.

An embedded cluster is closed to other users of the machine: every Ray server listens on loopback only (see
`init_embedded_ray`), the dashboard starts only when ``ray.dashboard`` asks for it (on loopback), and Ray's
token file (``~/.ray/auth_token``) is made with mode 0600, or narrowed to it (see `private_ray_token`). In local mode the same
actors run on one trio loop in this process instead (``host.LocalCluster``). What runs on the cluster, and
how it is connected, is ``topology.build_topology``'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import secrets
import signal
import socket
import stat
from pathlib import Path

from actors.runs.config import RaySection, RunSection
from actors.runs.host import STOP_TIMEOUT_S, ActorHost, LocalCluster
from actors.runs.recovery import NO_ANSWER, Liveness
from streams.private_files import SOCKET_ROOT, private_dir, remove_private_dir, write_private
from streams.security import CurveKeys, is_loopback

log = logging.getLogger(__name__)


NODE_HOST = "node"  # ray.host=node: each actor binds on the address Ray reports for the node it landed on


class _NodeActorHost(ActorHost):
    """An ActorHost whose streams bind on its node's address (``ray.host=node``): on a cluster each actor is
    reachable at its own machine's address. Defined here because only the launcher may know Ray."""

    def __init__(self, actor_cls, cfg, name: str, host: str, curve_dir: str | None, rebind: list[str],
                 ipc_dir: str | None):
        import ray

        node = ray.util.get_node_ip_address()
        if not is_loopback(node) and not curve_dir and not ipc_dir:
            raise ValueError(f"{name} landed on node {node}, beyond loopback: ray.host=node needs ray.curve_dir")
        super().__init__(actor_cls, cfg, name, node, curve_dir, rebind, ipc_dir)


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


def ray_token_path() -> Path | None:
    """The file Ray reads its cluster token from (None: the token is in ``RAY_AUTH_TOKEN``, no file)."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return None
    return Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")


def private_ray_token(create: bool) -> Path | None:
    """Ray's token file, mode 0600. Ray writes a missing one readable by every user (2.60: mode 0644 under the
    umask): with ``create`` (an embedded cluster, where token authentication is on unless ``RAY_AUTH_MODE`` turns
    it off) it is made here first, 0600 in a 0700 ``~/.ray``; an existing one of this user's is narrowed to 0600."""
    path = ray_token_path()
    if path is None or os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        return None
    if path.exists():
        info = path.stat()
        if info.st_uid == os.getuid() and info.st_mode & 0o077:
            os.chmod(path, 0o600)
            log.warning("Ray's token file %s was readable by other users (mode %04o): made it 0600", path,
                        stat.S_IMODE(info.st_mode))
    elif create and "RAY_AUTH_TOKEN_PATH" not in os.environ:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_private(path.parent, path.name, secrets.token_hex(32))  # what Ray's own generator makes
    return path


@contextlib.contextmanager
def _node_on_loopback(ray):
    """Ray 2.60 turns a node address of 127.0.0.1 into the machine's outward address (``resolve_ip_for_localhost``)
    and its servers then listen on every interface; with its switch for machines that host no multi-node cluster
    (``ENABLE_RAY_CLUSTER``, off on macOS and Windows) off while the node starts, the node's address stays
    127.0.0.1 and the GCS, the raylet, the workers and the agents listen on loopback only."""
    from ray._private import ray_constants

    before = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before


def init_embedded_ray(num_cpus: int | None = None, dashboard: bool = False) -> None:
    """Start Ray on this machine for this process, closed to other users (see the module's docstring)."""
    import ray

    private_ray_token(create=True)
    with _node_on_loopback(ray):
        ray.init(num_cpus=num_cpus, include_dashboard=dashboard, dashboard_host="127.0.0.1",
                 _node_ip_address="127.0.0.1", logging_level=logging.WARNING)
    private_ray_token(create=False)
    node = ray.util.get_node_ip_address()
    if not is_loopback(node):
        log.warning("the embedded Ray cluster listens on %s, beyond loopback (this Ray release ignores the "
                    "loopback request)", node)


class RayCluster:
    """Actors as Ray actors (one process each), their streams on ZeroMQ.

    ``resources`` maps an actor kind (learner, replay, reward, rollout, env, league) to the Ray resources each
    actor of that kind asks for (``GPU``, or a custom resource a node was started with): Ray then places it on
    a node that has them. ``host="node"`` binds each actor's streams on its own node's address.

    A cluster of one node on loopback that this process started or joined without an address (an embedded one)
    holds every actor on this machine: their streams are Unix sockets in a private directory of this process's
    (``ipc_dir``, mode 0700), which no other user can reach, instead of TCP ports (`ZmqTransport`)."""

    def __init__(self, address: str | None = None, num_cpus: int | None = None, host: str = "127.0.0.1",
                 curve_dir: str | None = None, resources: dict | None = None, dashboard: bool = False,
                 liveness: Liveness | None = None):
        import ray

        if host != NODE_HOST and not is_loopback(host) and not curve_dir:  # fail here, before any actor starts
            raise ValueError(f"ray.host={host} binds streams beyond loopback: set ray.curve_dir to the cluster's "
                             "CURVE keys (see README, 'Security')")
        if curve_dir:
            CurveKeys.load(curve_dir)  # keys open to other users fail here, naming the file, not in every actor
        self.resources = check_resources(resources or {})
        self.ray = ray
        self.host, self.curve_dir = host, curve_dir
        self.owns_ray = not ray.is_initialized()
        if self.owns_ray and address is None:
            init_embedded_ray(num_cpus, dashboard)
        elif self.owns_ray:
            private_ray_token(create=False)
            ray.init(address=address, logging_level=logging.WARNING)
        if host == NODE_HOST and not curve_dir:
            beyond = sorted({n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]
                             and not is_loopback(n["NodeManagerAddress"])})
            if beyond:
                raise ValueError(f"ray.host=node binds streams on the nodes' addresses, {beyond} beyond loopback: "
                                 "set ray.curve_dir to the cluster's CURVE keys (see README, 'Security')")
        self.liveness = liveness or Liveness()  # the health check's deadline (statistics_within)
        self.places: dict[str, dict] = {}  # actor -> its pid and host (ActorHost.where)
        nodes = [n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]]
        one_host = address is None and len(nodes) == 1 and is_loopback(nodes[0])
        self.ipc_dir = str(private_dir(SOCKET_ROOT, "streams")) if one_host else None
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
                actor_cls, cfg, name, self.host, self.curve_dir, rebind, self.ipc_dir)
            self.handles[name] = handle
            starting.append(handle.start.remote(peers))
        addresses = self.ray.get(starting)
        for name, actor_cls, cfg, peers in actors:
            self.specs[name] = (actor_cls, cfg, peers, self.ray.get(self.handles[name].bound.remote()))
            self.places[name] = self.ray.get(self.handles[name].where.remote())
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

    def statistics_within(self, names: list[str]) -> dict:
        """Each of ``names``' statistics, asked of all at once: a ping on its loop, then its statistics, each within
        ``liveness.timeout_s``; ``NO_ANSWER`` for an actor that answered either too late, the error for a dead
        one. The health check of ``recovery.statistics_or_recover``: it never waits longer than twice the
        deadline, whatever an actor does."""
        pings = {name: self.handles[name].ping.remote() for name in names}
        answers, asked = {}, {}
        in_time = self._answered(pings)
        for name, ref in pings.items():
            try:
                if ref not in in_time:
                    answers[name] = NO_ANSWER
                    continue
                self.ray.get(ref)
                asked[name] = self.handles[name].statistics.remote()
            except Exception as error:  # a dead actor's ping: its error, for the caller to judge
                answers[name] = error
        in_time = self._answered(asked)
        for name, ref in asked.items():
            try:
                answers[name] = self.ray.get(ref) if ref in in_time else NO_ANSWER
            except Exception as error:
                answers[name] = error
        return {name: answers[name] for name in names}

    def _answered(self, refs: dict) -> set:
        """Those of ``refs`` (name -> object ref) ready within the liveness deadline."""
        if not refs:
            return set()
        ready, _ = self.ray.wait(list(refs.values()), num_returns=len(refs), timeout=self.liveness.timeout_s)
        return set(ready)

    def log_stacks(self, name: str) -> None:
        """Have a silent actor's process write its threads' stacks to its log (SIGUSR1: ``ActorHost``'s
        faulthandler), where it runs on this host."""
        place = self.places.get(name)
        if place is None or place["host"] != socket.gethostname():
            log.error("%s is silent; it runs on %s, where its stacks cannot be asked for from here", name,
                      place["host"] if place else "an unknown host")
            return
        try:
            os.kill(place["pid"], signal.SIGUSR1)
            log.error("%s is silent: its stacks are asked for (SIGUSR1 to pid %d) and written to its log if it "
                      "still runs", name, place["pid"])
        except OSError as error:
            log.error("%s is silent; its stacks could not be asked for: %s", name, error)

    def shutdown(self) -> None:
        pings = {name: handle.ping.remote() for name, handle in self.handles.items()}
        in_time = self._answered(pings)
        silent = sorted(name for name, ref in pings.items() if ref not in in_time)
        if silent:  # a stuck actor cannot stop: waiting STOP_TIMEOUT_S for it would hold the run's end
            log.warning("%s answered no ping within %g s: killed without waiting for them to stop", silent,
                        self.liveness.timeout_s)
        stops = [handle.stop.remote() for name, handle in self.handles.items() if name not in silent]
        try:
            self.ray.get(stops, timeout=STOP_TIMEOUT_S)
        except Exception as error:  # an actor that already died cannot stop; say so and go on
            log.warning("not every actor stopped cleanly: %s", error)
        for handle in self.handles.values():
            self.ray.kill(handle)
        if self.owns_ray:
            self.ray.shutdown()
        remove_private_dir(self.ipc_dir)


def open_cluster(run: RunSection, ray: RaySection):
    """The cluster ``run.mode`` names: Ray (embedded, or ``ray.address``'s), or one trio loop in this process."""
    if run.mode == "local":
        return LocalCluster(transport=run.local_transport)
    if run.mode != "ray":
        raise ValueError(f"run.mode must be 'ray' or 'local', not {run.mode!r}")
    return RayCluster(address=ray.address, num_cpus=ray.num_cpus, host=ray.host, curve_dir=ray.curve_dir,
                      resources=ray.resources, dashboard=ray.dashboard,
                      liveness=Liveness(run.ping_timeout_s, run.ping_misses))
