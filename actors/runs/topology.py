"""The topology: every actor of a run, started and connected in one place, for one policy or a league.

A run is a population of learning members. Each member has its group: a learner, a replay, a reward actor and
its rollout actors. The env actors are shared by every member, and a league (when configured) chooses their
training matches. A single-policy run is a population of one member and no league: its actors keep their plain
names (``learner``, ``rollout-0``), a league's carry their member's (``learner-main``, ``rollout-main-0``).

episodes: env -> reward-m -> replay-m -> learner-m;  weights: learner-m -> rollout-m-*;
versions: learner-m -> env, replay-m (its ceiling on episodes' versions);  drops: reward-m, replay-m -> env (the
episodes they dropped, whose admission their env actor gives back);  generation: env -> rollout-m-*
(requests for m, and for m's snapshots), rollout -> env (completions, to the address in each request);
matches (a league): env -> league (requests, results), league -> env (assignments).

Actors of one layer start side by side (their processes load at once): every member's learner, then every
replay, every reward actor, every rollout actor, and the env actors.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from actors.runs.config import RunConfig, built_args, run_budget, sampling_stops
from actors.env.actor import EnvActor, EnvConfig
from actors.league.actor import LeagueActor, LeagueConfig
from actors.learner.dataset import DATASET_DIR
from actors.learner.actor import LearnerActor, LearnerConfig
from actors.learner.rank import LearnerRankActor, RankConfig
from actors.replay.actor import ReplayActor, ReplayConfig
from actors.reward.actor import RewardActor, RewardConfig
from actors.rollout.actor import RolloutActor, RolloutConfig
from actors.learner.staleness import parse_max_staleness

MEMBER_SEED_STRIDE = 101  # member k's learner and rollout seeds start at run.seed + 101 * k


@dataclass
class Group:
    """One learning member's actors, and where they listen."""

    member: str
    index: int  # the member's place in the population (its seeds)
    learner: str
    replay: str
    reward: str
    policy_dir: Path  # the learner's checkpoints
    spill_dir: Path  # replay's spill, a folder per life of the run
    model_path: str  # the member's starting model
    dataset_dir: Path | None = None  # the run's episode dataset (observe.dataset), its learner writes
    suffix: str = ""  # of its actors' names: "" in a single run, "-<member>" in a league
    learner_ranks: list[str] = field(default_factory=list)  # ranks 1.. of its learner group (learner.ranks > 1)
    rollouts: list[str] = field(default_factory=list)
    requests: dict[str, str] = field(default_factory=dict)  # rollout actor -> where it takes requests
    weights: str = ""  # the learner's publisher: versions and weight manifests
    episodes: str = ""  # where the reward actor takes finished episodes
    dropped: list[str] = field(default_factory=list)  # the reward actor's and replay's drop notices (publishers)
    start_version: int = 0  # the learner's version when this life of the run started
    rollouts_made: int = 0  # rollout actors ever started: a joining one gets a name never used

    def names(self) -> list[str]:
        return [self.learner, *self.learner_ranks, self.replay, self.reward, *self.rollouts]

    def learner_group(self) -> list[str]:
        """Its learner's processes: rank 0 (the learner) and the ranks that follow it."""
        return [self.learner, *self.learner_ranks]

    def owns(self, name: str) -> bool:
        return name in self.names()

    def rollout_name(self, i: int) -> str:
        return f"rollout{self.suffix}-{i}"


@dataclass
class Topology:
    groups: dict[str, Group] = field(default_factory=dict)  # member id -> its group, in the config's order
    envs: list[str] = field(default_factory=list)
    league: str | None = None  # the league actor, if the run has one
    league_addresses: dict | None = None  # where env actors reach it
    life: str = ""  # this start of the run (a resumed run is a new life): replay's spill and the data cursor
    ledger: str | None = None  # the env actors' ledgers of delivered episodes (``run.ledger``)
    tasks: str | None = None  # where env actors keep a role game's task buffer with the run
    snapshots: str | None = None  # a league's frozen snapshots
    tokenizer: str = ""  # the run's base model: the env actors' tokenizer
    envs_made: int = 0  # env actors ever started, as for rollout actors

    def names(self) -> list[str]:
        league = [self.league] if self.league else []
        return [*league, *(n for group in self.groups.values() for n in group.names()), *self.envs]

    def group_of(self, name: str) -> Group | None:
        return next((g for g in self.groups.values() if g.owns(name)), None)

    def replays(self) -> dict[str, str]:
        return {member: group.replay for member, group in self.groups.items()}


def policy_dir(cfg: RunConfig, member: str) -> str:
    """Where ``member``'s learner checkpoints, relative to the run directory."""
    return "policy" if cfg.league is None else f"members/{member}/policy"


def plan_groups(cfg: RunConfig, model_path: str, run_dir: Path) -> dict[str, Group]:
    """Each member's group, named: a single run's plainly (``learner``, ``replay/<life>``), a league's apart
    (``learner-<member>``, ``replay/<member>/<life>``)."""
    groups = {}
    for k, member in enumerate(cfg.members()):
        suffix = "" if cfg.league is None else f"-{member.id}"
        learner = f"learner{suffix}"
        groups[member.id] = Group(member.id, k, learner, f"replay{suffix}", f"reward{suffix}",
                                  policy_dir=run_dir / policy_dir(cfg, member.id),
                                  spill_dir=run_dir / "replay" / member.id if suffix else run_dir / "replay",
                                  model_path=str(member.model or model_path), suffix=suffix,
                                  dataset_dir=run_dir / DATASET_DIR if cfg.observe.dataset else None,
                                  learner_ranks=[f"{learner}-rank{r}" for r in range(1, cfg.learner.ranks)])
    return groups


def build_topology(cluster, cfg: RunConfig, model_path: str | Path, run_dir: Path) -> Topology:
    """Start and connect every actor of the run ``cfg`` describes: the whole data-flow graph, in one place."""
    top = Topology(plan_groups(cfg, str(model_path), run_dir), life=time.strftime("%Y%m%d-%H%M%S"),
                   tokenizer=str(model_path))
    if cfg.league is not None:
        top.league, top.snapshots = "league", str(run_dir / "league" / "snapshots")
        Path(top.snapshots).mkdir(parents=True, exist_ok=True)
        top.league_addresses = cluster.spawn(top.league, LeagueActor, LeagueConfig(
            members=[{"id": m.id, "role": m.role} for m in cfg.league.members], state_dir=str(run_dir / "league"),
            resume=bool(cfg.resume), seed=cfg.run.seed, **built_args(cfg.league.args)), peers={})
    top.tasks = str(run_dir / "tasks")
    if cfg.run.ledger:
        top.ledger = str(run_dir / "ledger" / top.life)
        Path(top.ledger).mkdir(parents=True, exist_ok=True)
    groups = list(top.groups.values())
    for group in groups:  # a learner group's processes are placed together (a GPU each, where there are GPUs)
        cluster.reserve_group(group.learner_group(), cfg.learner.args.device)
    learners = cluster.spawn_many([(g.learner, LearnerActor, learner_config(cfg, g, top.life), {}) for g in groups])
    spawn_learner_ranks(cluster, cfg, top.life, groups, learners)
    replays = cluster.spawn_many([(g.replay, ReplayActor, replay_config(cfg, g, top.life),
                                   {"learner": [learner["batches"]], "versions": [learner["weights"]]})
                                  for g, learner in zip(groups, learners)])
    rewards = cluster.spawn_many([(g.reward, RewardActor, RewardConfig(tokenizer_path=top.tokenizer,
                                                                          **built_args(cfg.reward.args)),
                                   {"replay": [replay["episodes"]]}) for g, replay in zip(groups, replays)])
    for group, learner, replay, reward in zip(groups, learners, replays, rewards):
        group.weights, group.episodes, group.start_version = learner["weights"], reward["episodes"], learner["version"]
        group.dropped = [reward["dropped"], replay["dropped"]]
    spawn_rollouts(cluster, cfg, top, {g.member: cfg.rollout.count for g in groups})
    count = cfg.env.count
    top.envs.extend(spawn_envs(cluster, cfg, top, [(f"env-{i}", i, (i, count)) for i in range(count)]))
    return top


def admission_start(cfg: RunConfig) -> int:
    """The staleness bound env actors admit against until the learner announces one: ``learner.max_staleness``,
    or with ``auto`` its start."""
    eta = parse_max_staleness(cfg.learner.max_staleness)
    return cfg.learner.args.staleness.start if eta is None else eta


def learner_config(cfg: RunConfig, group: Group, life: str) -> LearnerConfig:
    return LearnerConfig(
        model_path=group.model_path, policy_id=group.member, temperature=cfg.sampling.temperature,
        max_staleness=cfg.learner.max_staleness, save_dir=str(group.policy_dir), ranks=cfg.learner.ranks,
        checkpoint_every=cfg.learner.checkpoint_every, resume=bool(cfg.resume), data_life=life,
        dataset_dir=str(group.dataset_dir) if group.dataset_dir else None,
        seed=cfg.run.seed + MEMBER_SEED_STRIDE * group.index, **run_budget(cfg), **built_args(cfg.learner.args))


def spawn_learner_ranks(cluster, cfg: RunConfig, life: str, groups: list[Group], learners: list[dict]) -> None:
    """Ranks 1.. of each learner group, meeting their rank 0 at the rendezvous its start returned."""
    ranks = []
    for group, learner in zip(groups, learners):
        config = learner_config(cfg, group, life)
        ranks += [(name, LearnerRankActor, RankConfig(config, r, learner["rendezvous"]), {})
                  for r, name in enumerate(group.learner_ranks, start=1)]
    if ranks:
        cluster.spawn_many(ranks)


def replay_config(cfg: RunConfig, group: Group, life: str) -> ReplayConfig:
    spill = str(group.spill_dir / life) if cfg.replay.spill else None  # with it a restarted replay loses nothing
    return ReplayConfig(spill_dir=spill, checkpoint_dir=str(group.policy_dir), resume=bool(cfg.resume),
                        vocab_size=model_vocab_size(group.model_path), checkpoint_every=cfg.learner.checkpoint_every,
                        max_row_tokens=model_context(group.model_path), **built_args(cfg.replay.args))


def model_vocab_size(model_path: str) -> int:
    """The rows of the model's embedding: a token id at or above it is no token of the model's."""
    from transformers import AutoConfig

    return int(AutoConfig.from_pretrained(model_path).vocab_size)


def model_context(model_path: str) -> int | None:
    """The model's context: its max_position_embeddings (None when its config names none)."""
    from transformers import AutoConfig

    return getattr(AutoConfig.from_pretrained(model_path), "max_position_embeddings", None)


def spawn_rollouts(cluster, cfg: RunConfig, top: Topology, joining: dict[str, int]) -> None:
    """Start ``joining[member]`` more rollout actors for each member, side by side, with names never used (at
    the start, or joining a run: each takes the latest weights, which its learner announces every second); their
    groups get their names and request addresses."""
    actors = []
    for member, count in joining.items():
        group = top.groups[member]
        start = max(group.rollouts_made, len(group.rollouts))
        group.rollouts_made = start + count
        actors += [(group, group.rollout_name(i), RolloutConfig(
            model_path=group.model_path, policy_id=member, backend=cfg.rollout.backend,
            seed=cfg.run.seed + MEMBER_SEED_STRIDE * group.index + i, snapshot_dir=top.snapshots,
            stop=sampling_stops(cfg), **built_args(cfg.rollout.args))) for i in range(start, group.rollouts_made)]
    started = cluster.spawn_many([(name, RolloutActor, rollout, {"weights": [group.weights]})
                                  for group, name, rollout in actors])
    for (group, name, _), addresses in zip(actors, started):
        group.rollouts.append(name)
        group.requests[name] = addresses["requests"]


def spawn_envs(cluster, cfg: RunConfig, top: Topology, actors: list[tuple[str, int, tuple]]) -> list[str]:
    """Start env actors ``(name, seed index, admission slot)`` side by side, connected to every member's
    group (at the start, or joining a run: they start training only when told, once the driver gave them their
    share of the admission allowance). Returns their names."""
    groups = top.groups.values()
    first = next(iter(top.groups))
    cluster.spawn_many([(name, EnvActor, EnvConfig(
        tokenizer_path=top.tokenizer,
        policy_id=first, temperature=cfg.sampling.temperature, max_new_tokens=cfg.sampling.max_new_tokens,
        max_staleness=admission_start(cfg), batch_episodes=cfg.replay.args.batch_episodes,
        admission_slot=slot, start_versions={g.member: g.start_version for g in groups},
        seed=cfg.run.seed * 1000 + i, ledger_dir=top.ledger, life=top.life, tasks_dir=top.tasks,
        prompt={"template": cfg.prompt.template, "history": cfg.prompt.history, "system": cfg.prompt.system},
        max_context_tokens=cfg.prompt.max_context_tokens or model_context(top.groups[first].model_path),
        **built_args(cfg.env.args)),
        env_peers(top)) for name, i, slot in actors])
    return [name for name, _, _ in actors]


def env_peers(top: Topology) -> dict:
    """Whom an env actor sends to and hears from: each member's rollout actors and reward actor, every learner's
    versions, and the league. Each actor gets its own (a scale later changes one actor's, not all of theirs)."""
    groups = top.groups.values()
    peers = {"rollout": {g.member: [g.requests[r] for r in g.rollouts] for g in groups},
             "reward": {g.member: [g.episodes] for g in groups}, "versions": [g.weights for g in groups],
             "dropped": [address for g in groups for address in g.dropped]}
    if top.league_addresses is not None:
        peers["league"] = top.league_addresses
    return peers
