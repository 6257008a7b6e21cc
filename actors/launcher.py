"""The launcher: reads the run config, starts every actor and wires the whole topology in one function.

On one machine it starts an embedded Ray cluster; with ``ray.address`` it attaches to a running one. Each
actor is a plain class; here, and only here, it is wrapped with ``ray.remote``. In local mode the same
actors run on one trio loop in this process instead.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from actors.env import EnvActor, EnvConfig
from actors.host import ActorHost, LocalCluster
from actors.learner import LearnerActor, LearnerConfig
from actors.replay import ReplayActor, ReplayConfig
from actors.reward import RewardActor, RewardConfig
from actors.rollout import RolloutActor, RolloutConfig
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
        self.specs: dict[str, tuple] = {}  # name -> (class, config, peers, bound addresses): what a restart needs
        # num_cpus=0: actors share the machine's cores; Ray only places and supervises them.
        self._remote_host = ray.remote(num_cpus=0, max_concurrency=4)(
            _NodeActorHost if host == NODE_HOST else ActorHost)

    def _placement(self, name: str) -> dict:
        """Ray options that place ``name`` where ``ray.resources`` says its kind goes."""
        wanted = dict(self.resources.get(actor_kind(name), {}))
        options = {"num_gpus": wanted.pop("GPU")} if "GPU" in wanted else {}
        if "CPU" in wanted:
            options["num_cpus"] = wanted.pop("CPU")
        return {**options, "resources": wanted} if wanted else options

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

    def set_peers(self, name: str, key: str, addresses: list[str]) -> None:
        """What a restart of ``name`` connects to under ``key`` from now on (the rollout actors after a scale)."""
        self.specs[name][2][key] = list(addresses)

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
            self.ray.get(stops, timeout=30)
        except Exception as error:  # an actor that already died cannot stop; say so and go on
            log.warning("not every actor stopped cleanly: %s", error)
        for handle in self.handles.values():
            self.ray.kill(handle)
        if self.owns_ray:
            self.ray.shutdown()


@dataclass
class Topology:
    learner: str = "learner"
    replay: str = "replay"
    reward: str = "reward"
    rollouts: list[str] = field(default_factory=list)
    envs: list[str] = field(default_factory=list)
    life: str = ""  # this start of the run (a resumed run is a new life): replay's spill and the data cursor
    weights: str = ""  # the learner's publisher: versions and weight manifests
    requests: dict[str, str] = field(default_factory=dict)  # rollout actor -> where it takes requests
    episodes: str = ""  # where the reward actor takes finished episodes
    start_version: int = 0  # the learner's version when the run (this life) started
    ledger: str | None = None  # the env actors' ledgers of delivered episodes (``run.ledger``)

    def names(self) -> list[str]:
        return [self.learner, self.replay, self.reward, *self.rollouts, *self.envs]


def run_budget(cfg: dict) -> dict:
    """The run's training budget, for the learner's learning-rate schedule (``learner.args.lr_decay``)."""
    run = cfg["run"]
    return {"budget_s": run["minutes"] * 60 if run.get("minutes") else None, "budget_versions": run.get("max_versions")}


def build_topology(cluster, cfg: dict, model_path: str | Path, run_dir: Path) -> Topology:
    """Start and connect every actor of a run: the whole data-flow graph, in one place.

    episodes: env -> reward -> replay -> learner;  weights: learner -> rollout;  versions: learner -> env;
    generation: env -> rollout (requests) and rollout -> env (completions, to the address in the request).
    """
    model_path, top = str(model_path), Topology(life=time.strftime("%Y%m%d-%H%M%S"))
    sampling = cfg["sampling"]
    learner = cluster.spawn(top.learner, LearnerActor, LearnerConfig(
        model_path=model_path, temperature=sampling["temperature"], save_dir=str(run_dir / "policy"),
        max_staleness=cfg["learner"]["max_staleness"], seed=cfg["run"]["seed"],
        checkpoint_every=cfg["learner"].get("checkpoint_every", 0), resume=bool(cfg.get("resume")),
        data_life=top.life, **run_budget(cfg), **cfg["learner"]["args"]), peers={})
    spill = str(run_dir / "replay" / top.life) if cfg["replay"].get("spill") else None
    replay = cluster.spawn(top.replay, ReplayActor, ReplayConfig(spill_dir=spill, **cfg["replay"]["args"]),
                           peers={"learner": [learner["batches"]]})
    if cfg["run"].get("ledger"):
        top.ledger = str(run_dir / "ledger" / top.life)
        Path(top.ledger).mkdir(parents=True, exist_ok=True)
    reward = cluster.spawn(top.reward, RewardActor, RewardConfig(**cfg["reward"]["args"]),
                           peers={"replay": [replay["episodes"]]})
    top.weights, top.episodes, top.start_version = learner["weights"], reward["episodes"], learner["version"]
    spawn_rollouts(cluster, cfg, model_path, top, range(cfg["rollout"]["count"]))
    envs = cfg["env"]["count"]
    top.envs.extend(spawn_envs(cluster, cfg, model_path, top, [(f"env-{i}", i, (i, envs)) for i in range(envs)]))
    return top


def spawn_envs(cluster, cfg: dict, model_path: str, top: Topology, actors: list[tuple[str, int, tuple]]) -> None:
    """Start env actors ``(name, seed index, admission slot)`` side by side, sending to the rollout actors of
    ``top`` (at the start, or joining a run: they start training only when told, once the launcher gave them
    their share of the admission allowance). Returns their names."""
    sampling = cfg["sampling"]
    cluster.spawn_many([(name, EnvActor, EnvConfig(
        tokenizer_path=str(model_path), temperature=sampling["temperature"],
        max_new_tokens=sampling["max_new_tokens"], max_staleness=cfg["learner"]["max_staleness"],
        batch_episodes=cfg["replay"]["args"]["batch_episodes"], admission_slot=slot,
        start_version=top.start_version, seed=cfg["run"]["seed"] * 1000 + i, ledger_dir=top.ledger,
        **cfg["env"]["args"]),
        {"rollout": [top.requests[r] for r in top.rollouts], "reward": [top.episodes], "versions": [top.weights]})
        for name, i, slot in actors])
    return [name for name, _, _ in actors]


def spawn_rollouts(cluster, cfg: dict, model_path: str, top: Topology, indices) -> None:
    """Start rollout actors ``rollout-<i>`` side by side (at the start, or joining a run: each takes the latest
    weights, which the learner announces every second); ``top`` gets their names and request addresses."""
    names = [f"rollout-{i}" for i in indices]
    started = cluster.spawn_many([(name, RolloutActor, RolloutConfig(
        model_path=str(model_path), backend=cfg["rollout"]["backend"], seed=cfg["run"]["seed"] + i,
        **cfg["rollout"]["args"]), {"weights": [top.weights]}) for name, i in zip(names, indices)])
    for name, rollout in zip(names, started):
        top.rollouts.append(name)
        top.requests[name] = rollout["requests"]


def open_cluster(cfg: dict):
    if cfg["run"]["mode"] == "local":
        return LocalCluster(transport=cfg["run"].get("local_transport", "memory"))
    if cfg["run"]["mode"] != "ray":
        raise ValueError(f"run.mode must be 'ray' or 'local', not {cfg['run']['mode']!r}")
    ray_cfg = cfg["ray"]
    return RayCluster(address=ray_cfg["address"], num_cpus=ray_cfg["num_cpus"], host=ray_cfg["host"],
                      curve_dir=ray_cfg["curve_dir"], resources=ray_cfg.get("resources"))


VLLM_MAX_TEMPERATURE = 2.0  # vLLM's SamplingParams refuses higher temperatures


def check_config(cfg: dict) -> None:
    """Refuse, before anything starts, a config that would fail only once actors run."""
    temperature = cfg["sampling"]["temperature"]
    if cfg["rollout"]["backend"] == "vllm" and not 0 < temperature <= VLLM_MAX_TEMPERATURE:
        raise ValueError(f"sampling.temperature={temperature}: rollout.backend=vllm samples at temperatures in "
                         f"(0, {VLLM_MAX_TEMPERATURE:g}]")


def launch(cfg: dict) -> dict:
    """Run the job ``cfg`` describes; returns (and writes) its summary. Ctrl-C ends it cleanly."""
    from actors.runs.driver import Run

    check_config(cfg)
    return Run(cfg).execute()


@dataclass
class LeagueTopology:
    """A league's actors: per learning member its learner, replay, reward and rollout group; shared env
    actors; and the league."""

    members: dict[str, Topology] = field(default_factory=dict)
    envs: list[str] = field(default_factory=list)
    league: str = "league"

    def names(self) -> list[str]:
        return [self.league, *(n for top in self.members.values() for n in top.names() if n not in self.envs),
                *self.envs]


def build_league_topology(cluster, cfg: dict, model_path: str | Path, run_dir: Path) -> LeagueTopology:
    """Start and connect a self-play league: the whole graph, in one place.

    per member m: env -> reward-m -> replay-m -> learner-m; learner-m -> rollout-m-* (weights) and -> env
    (versions); env -> rollout-m-* (requests for m and m's snapshots, read from run_dir/league/snapshots);
    matches: env -> league (requests, results), league -> env (assignments).
    """
    from actors.league import LeagueActor, LeagueConfig

    league_cfg, top = cfg["league"], LeagueTopology()
    sampling, resume, life = cfg["sampling"], bool(cfg.get("resume")), time.strftime("%Y%m%d-%H%M%S")
    snapshots = run_dir / "league" / "snapshots"
    snapshots.mkdir(parents=True, exist_ok=True)
    league = cluster.spawn(top.league, LeagueActor, LeagueConfig(
        members=[{"id": m["id"], "role": m["role"]} for m in league_cfg["members"]], state_dir=str(run_dir / "league"),
        resume=resume, seed=cfg["run"]["seed"], **league_cfg["args"]), peers={})
    rollouts, rewards, publishers, versions = {}, {}, [], {}
    for k, member in enumerate(league_cfg["members"]):
        m = member["id"]
        mtop = Topology(f"learner-{m}", f"replay-{m}", f"reward-{m}", life=life)
        base = str(member.get("model") or model_path)
        learner = cluster.spawn(mtop.learner, LearnerActor, LearnerConfig(
            model_path=base, temperature=sampling["temperature"], save_dir=str(run_dir / "members" / m / "policy"),
            max_staleness=cfg["learner"]["max_staleness"], seed=cfg["run"]["seed"] + 101 * k,
            checkpoint_every=cfg["learner"].get("checkpoint_every", 0), resume=resume, data_life=life,
            **run_budget(cfg),
            **{**cfg["learner"]["args"], "policy_id": m}), peers={})
        spill = str(run_dir / "replay" / m / life) if cfg["replay"].get("spill") else None  # a restart loses nothing
        replay = cluster.spawn(mtop.replay, ReplayActor, ReplayConfig(spill_dir=spill, **cfg["replay"]["args"]),
                               peers={"learner": [learner["batches"]]})
        rewards[m] = [cluster.spawn(mtop.reward, RewardActor, RewardConfig(**cfg["reward"]["args"]),
                                    peers={"replay": [replay["episodes"]]})["episodes"]]
        rollouts[m] = []
        for i in range(cfg["rollout"]["count"]):
            mtop.rollouts.append(f"rollout-{m}-{i}")
            rollouts[m].append(cluster.spawn(mtop.rollouts[-1], RolloutActor, RolloutConfig(
                model_path=base, backend=cfg["rollout"]["backend"], seed=cfg["run"]["seed"] + 101 * k + i,
                snapshot_dir=str(snapshots), **{**cfg["rollout"]["args"], "policy_id": m}),
                peers={"weights": [learner["weights"]]})["requests"])
        publishers.append(learner["weights"])
        versions[m] = learner["version"]
        top.members[m] = mtop
    for i in range(cfg["env"]["count"]):
        top.envs.append(f"env-{i}")
        cluster.spawn(top.envs[-1], EnvActor, EnvConfig(
            tokenizer_path=str(model_path), temperature=sampling["temperature"],
            max_new_tokens=sampling["max_new_tokens"], max_staleness=cfg["learner"]["max_staleness"],
            batch_episodes=cfg["replay"]["args"]["batch_episodes"], admission_slot=(i, cfg["env"]["count"]),
            start_versions=versions, seed=cfg["run"]["seed"] * 1000 + i,
            **{**cfg["env"]["args"], "policy_id": league_cfg["members"][0]["id"]}),
            peers={"rollout": rollouts, "reward": rewards, "versions": publishers, "league": league})
    return top
