"""The run config, typed: one dataclass per section, registered with Hydra as the schema of every job.

``configs/launch.yaml`` and ``configs/league.yaml`` (and the group files they compose) are merged onto
``RunConfig``, so a misspelt key or a value of the wrong type fails when the config is composed, naming the key.
The ``args`` of a group are each actor's own config (``LearnerConfig``, ``RolloutConfig``, ...) less the fields
the topology builder fills in (paths, seeds, addresses, and the values several actors share): their types and
defaults are declared once, on the actor's dataclass, and the schema is derived from it here.

A value that several actors share is declared once: the policy id (``run.policy_id``; a league's members carry
their own), the staleness bound (``learner.max_staleness``), the batch size (``replay.args.batch_episodes``) and
the sampling settings (``sampling``). ``check`` refuses, before anything starts, a config whose parts contradict
each other, naming the keys.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Optional

from actors.models.base_model import TinyModelConfig
from actors.models.chat import prompt_format
from envs.answers import THINK, default_stops
from actors.models.random_model import ModelShape, random_model_config
from actors.env.actor import EnvConfig
from actors.league.actor import LeagueConfig
from actors.learner.actor import LearnerConfig
from actors.replay.actor import ReplayConfig
from actors.reward.actor import RewardConfig
from actors.rollout.actor import RolloutConfig, engine_problems
from actors.observe.wandb_log import MODES as WANDB_MODES
from streams.disk import name_problem

# Fields of the actors' configs that the topology builder fills in: not settable under ``<group>.args``.
BUILT = {
    EnvConfig: ("tokenizer_path", "policy_id", "temperature", "max_new_tokens", "max_staleness", "batch_episodes",
                "admission_slot", "start_version", "start_versions", "seed", "incarnation", "started_before",
                "admission_offset", "ledger_dir", "life", "tasks_dir", "prompt", "max_context_tokens"),
    RolloutConfig: ("model_path", "policy_id", "backend", "seed", "snapshot_dir", "stop"),
    LearnerConfig: ("model_path", "policy_id", "temperature", "max_staleness", "save_dir", "checkpoint_every",
                    "resume", "data_life", "life", "seed", "budget_s", "budget_versions", "ranks", "dataset_dir"),
    ReplayConfig: ("spill_dir", "checkpoint_dir", "resume", "vocab_size", "checkpoint_every", "max_row_tokens"),
    LeagueConfig: ("members", "state_dir", "resume", "seed"),
    RewardConfig: ("tokenizer_path",),
}
# Keys that moved: an override of the old path fails with a message naming the new one.
MOVED = {f"{group}.args.policy_id": "run.policy_id" for group in ("env", "rollout", "learner")}


def _schema_type(hint):
    """``X | None`` as ``Optional[X]`` (the form OmegaConf reads), recursively inside containers."""
    if isinstance(hint, types.UnionType):
        return typing.Union[tuple(_schema_type(a) for a in typing.get_args(hint))]
    return hint


def args_schema(cls, name: str, exclude=(), optional=()) -> type:
    """A dataclass with ``cls``'s fields (types and defaults) except ``exclude``; ``optional`` fields may be null."""
    hints = typing.get_type_hints(cls)
    fields = []
    for f in dataclasses.fields(cls):
        if f.name in exclude:
            continue
        hint = _schema_type(hints[f.name])
        if f.name in optional:
            hint = Optional[hint]
        default = (field(default_factory=f.default_factory) if f.default_factory is not dataclasses.MISSING
                   else field(default=f.default))
        fields.append((f.name, hint, default))
    schema = dataclasses.make_dataclass(name, fields)
    schema.__module__ = __name__
    return schema


EnvArgs = args_schema(EnvConfig, "EnvArgs", BUILT[EnvConfig])
RolloutArgs = args_schema(RolloutConfig, "RolloutArgs", BUILT[RolloutConfig])
LearnerArgs = args_schema(LearnerConfig, "LearnerArgs", BUILT[LearnerConfig])
ReplayArgs = args_schema(ReplayConfig, "ReplayArgs", BUILT[ReplayConfig])
RewardArgs = args_schema(RewardConfig, "RewardArgs", BUILT[RewardConfig])
LeagueArgs = args_schema(LeagueConfig, "LeagueArgs", BUILT[LeagueConfig])
# null warmup_env: the run's environment (env.args.env_name and env_args)
TinyArgs = args_schema(TinyModelConfig, "TinyArgs", optional=("warmup_env",))
# null tokenizer_env: the run's environment (env.args.env_name and env_args); builtin: a built-in text
ShapeArgs = args_schema(ModelShape, "ShapeArgs", optional=("tokenizer_env",))
MODEL_INITS = ("tiny", "random")


def built_args(args) -> dict:
    """A group's ``args`` as keyword arguments of its actor's config (nested configs stay objects)."""
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(args)}


@dataclass
class RunSection:
    name: Optional[str] = None  # run directory name (default: the start time)
    dir: str = "runs"  # where run directories go
    policy_id: str = "main"  # the learning policy's id (a league's members carry their own)
    minutes: float = 8.0  # training budget, wall clock (evaluations before and after come on top)
    max_versions: Optional[int] = None  # or stop after this many learner updates
    max_matches: Optional[int] = None  # a league: or stop after this many rated matches
    target_return: Optional[float] = None  # or stop once the mean training return reaches this
    return_window_s: float = 30.0  # train_return: the mean over the training episodes that ended in this window ...
    return_window_episodes: int = 128  # ... and over at least this many of them
    log_every_s: float = 5.0  # metrics, progress and health-check cadence
    seed: int = 0
    mode: str = "ray"  # ray: one process per actor on (embedded) Ray; local: every actor on one trio loop
    local_transport: str = "memory"  # local mode only: memory channels, or zmq for real sockets
    progress: bool = True
    ledger: bool = False  # write each delivered training episode's id (run dir/ledger): the chaos benchmark's
    restart: bool = True  # restart an actor that died (any kind); false: end the run and say how to resume
    max_restarts: int = 5  # restarts of one actor within restart_window_s; one more death ends the run
    restart_window_s: float = 600.0
    restart_backoff_s: float = 2.0  # an actor's 2nd restart within the window waits this long after its 1st, then x2
    ping_timeout_s: float = 30.0  # run.mode=ray: an actor that answers no health check within this is silent ...
    ping_misses: int = 3  # ... and one silent this many checks in a row is hung: its stacks logged, it is restarted


@dataclass
class RaySection:
    address: Optional[str] = None  # null: an embedded cluster; "auto" or "host:port": a running one
    num_cpus: Optional[int] = None  # embedded cluster only (null: all cores)
    host: str = "127.0.0.1"  # where the actors' ZeroMQ sockets bind; "node": each actor on its node's address
    curve_dir: Optional[str] = None  # the cluster's CURVE keys: encrypts streams, admits only its clients
    resources: dict[str, Any] = field(default_factory=dict)  # actor kind -> Ray resources each actor asks for
    dashboard: bool = False  # embedded cluster only: start Ray's dashboard (on 127.0.0.1)


@dataclass
class ModelSection:
    path: Optional[str] = None  # a Hugging Face model directory (wins over init); null: a model tidal makes
    cache_dir: str = "~/.cache/tidal/models"  # where the models tidal makes are kept, by a fingerprint of their config
    init: str = "tiny"  # tiny: tidal's tiny model, warmed up | random: random weights of the architecture `shape`
    tiny: TinyArgs = field(default_factory=TinyArgs)
    shape: ShapeArgs = field(default_factory=ShapeArgs)


@dataclass
class SamplingSection:
    temperature: float = 1.0
    max_new_tokens: int = 8
    stop: Optional[list[str]] = None  # strings that end a completion, kept in it (both backends); null: the answer
    # form's (env.args.answer: "]" for first_bracket, none for the others: envs.answers.default_stops)


@dataclass
class PromptSection:
    """How a turn's prompt is rendered (``actors.models.chat``, docs/models.md)."""

    template: str = "chat"  # chat: the model's chat template | raw: the observation's text | a configs/templates/ name
    history: str = "last"  # last: the current observation | transcript: the game so far as one message | chat: as
    # alternating user/assistant turns (the policy's earlier completions as the assistant's)
    system: Optional[str] = None  # a system message (a template's own when null)
    max_context_tokens: Optional[int] = None  # a turn's prompt and token budget must fit, else its episode ends
    # truncated; null: the model's max_position_embeddings


@dataclass
class EnvGroup:
    count: int = 1  # env actors
    max_count: int = 16  # the most env actors `tidal scale` may ask for
    args: EnvArgs = field(default_factory=EnvArgs)


@dataclass
class AutoscaleConfig:
    """``rollout.autoscale``: add rollout actors while requests queue up, remove them while idle (run.mode=ray)."""

    enabled: bool = False
    min_actors: int = 1
    max_actors: int = 4
    queue_high: float = 32.0  # requests waiting per rollout actor that count as "behind"
    idle_above: float = 0.5  # mean idle fraction of the rollout actors that counts as "idle"
    patience: int = 3  # snapshots in a row before a step

    def __post_init__(self):
        if not 1 <= self.min_actors <= self.max_actors:
            raise ValueError(f"autoscale needs 1 <= min_actors <= max_actors, not {self.min_actors}, {self.max_actors}")
        if self.patience < 1:
            raise ValueError(f"autoscale patience must be >= 1, not {self.patience}")


@dataclass
class RolloutGroup:
    count: int = 1  # rollout actors of each learning member
    max_count: int = 16  # the most rollout actors (of each member) `tidal scale` or the autoscaler may ask for
    backend: str = "hf"  # hf | vllm
    autoscale: AutoscaleConfig = field(default_factory=AutoscaleConfig)
    args: RolloutArgs = field(default_factory=RolloutArgs)


@dataclass
class RewardGroup:
    args: RewardArgs = field(default_factory=RewardArgs)


@dataclass
class ReplayGroup:
    spill: bool = True  # keep episodes and sent batches on disk: a restarted replay loses nothing
    args: ReplayArgs = field(default_factory=ReplayArgs)


@dataclass
class LearnerGroup:
    max_staleness: Any = 2  # eta: how many versions behind the learner a token may be (admission and learner); or
    # auto: set each version from the importance weights, within learner.args.staleness (docs/staleness.md)
    checkpoint_every: int = 50  # versions between checkpoints
    ranks: int = 1  # learner processes training each policy data-parallel (FSDP2; needs run.mode=ray when > 1)
    args: LearnerArgs = field(default_factory=LearnerArgs)


@dataclass
class EvalSection:
    opponent: str = "random"  # a single-policy run: its policy against this, in each seat
    opponents: list[str] = field(default_factory=list)  # a league: every main agent against each of these
    games_per_seat: int = 100  # per evaluation during training
    endpoint_games_per_seat: int = 300  # the start (base model) and final evaluations; 0: none
    every_s: float = 60.0  # 0 turns evaluation during training off


@dataclass
class ObserveSection:
    tensorboard: bool = True  # every metric as it is measured, as TensorBoard events under <run dir>/tensorboard
    dataset: bool = True  # every trained episode as Parquet under <run dir>/episodes/<life>/<member>/
    wandb: bool = False  # the same figures as TensorBoard to Weights & Biases (the wandb extra)
    wandb_project: str = "tidal"
    wandb_mode: str = "offline"  # offline: kept under <run dir>/wandb, no network (`wandb sync` later); or online


@dataclass
class Member:
    id: str
    role: str = "main"
    model: Optional[str] = None  # null: the run's base model; or a Hugging Face model directory


@dataclass
class LeagueSection:
    members: list[Member] = field(default_factory=list)
    args: LeagueArgs = field(default_factory=LeagueArgs)


@dataclass
class RunConfig:
    resume: Optional[str] = None  # a run directory: continue that run from its checkpoints
    run: RunSection = field(default_factory=RunSection)
    ray: RaySection = field(default_factory=RaySection)
    model: ModelSection = field(default_factory=ModelSection)
    sampling: SamplingSection = field(default_factory=SamplingSection)
    prompt: PromptSection = field(default_factory=PromptSection)
    env: EnvGroup = field(default_factory=EnvGroup)
    rollout: RolloutGroup = field(default_factory=RolloutGroup)
    reward: RewardGroup = field(default_factory=RewardGroup)
    replay: ReplayGroup = field(default_factory=ReplayGroup)
    learner: LearnerGroup = field(default_factory=LearnerGroup)
    eval: EvalSection = field(default_factory=EvalSection)
    observe: ObserveSection = field(default_factory=ObserveSection)
    league: Optional[LeagueSection] = None  # set: a league of these members (tidal league run)

    def members(self) -> list[Member]:
        """The learning members: a league's, or the one policy of a single run."""
        return list(self.league.members) if self.league else [Member(self.run.policy_id)]


# What a resume does not take from a run directory's config.json unless given again on its command line: these
# reach outside the run (a Ray cluster the driver joins, whose workers' results it unpickles; keys it trusts; a
# model it loads; a service it sends to), and a run directory may have been written by someone else.
OUTSIDE_KEYS = ("ray.address", "ray.curve_dir", "model.path", "observe.wandb", "observe.wandb_project",
                "observe.wandb_mode")


def outside_settings(saved: dict) -> dict[str, Any]:
    """The ``OUTSIDE_KEYS`` a config (as plain data: ``dataclasses.asdict`` or a ``config.json``) sets to other
    than their defaults, by key."""
    defaults = dataclasses.asdict(RunConfig())
    found = {}
    for key in OUTSIDE_KEYS:
        section, name = key.split(".")
        value = (saved.get(section) or {}).get(name, defaults[section][name])
        if value != defaults[section][name]:
            found[key] = value
    return found


def override(key: str, value: Any) -> str:
    """``key=value`` as a command line gives it (Hydra's dotlist: ``null``, ``true``, numbers as JSON)."""
    return f"{key}={value if isinstance(value, str) else json.dumps(value)}"


def unknown_keys(given: dict, known: dict, path: str = "") -> list[str]:
    """The keys of ``given`` (a composed config) that ``known`` (the same, as the schema kept it) lacks."""
    unknown = []
    for key, value in given.items():
        if key not in known:
            unknown.append(f"{path}{key}")
        elif isinstance(value, dict) and isinstance(known[key], dict):
            unknown += unknown_keys(value, known[key], f"{path}{key}.")
    return unknown


def run_budget(cfg: RunConfig) -> dict:
    """The run's training budget, for the learner's learning-rate schedule (``learner.args.lr_decay``)."""
    return {"budget_s": cfg.run.minutes * 60 if cfg.run.minutes else None, "budget_versions": cfg.run.max_versions}


def register() -> None:
    """Make ``RunConfig`` Hydra's schema ``tidal_schema`` (the first entry of every job's defaults list)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="tidal_schema", node=RunConfig)


def observe_problems(observe: ObserveSection) -> list[str]:
    if observe.wandb_mode not in WANDB_MODES:
        return [f"observe.wandb_mode must be one of {', '.join(WANDB_MODES)}, not {observe.wandb_mode!r}"]
    if observe.wandb and importlib.util.find_spec("wandb") is None:
        return ["observe.wandb=true needs the wandb extra: pip install -e '.[wandb]'"]
    return []


def check(cfg: RunConfig) -> None:
    """Refuse, before anything starts, a config whose parts contradict each other (or would fail only once
    actors run), naming the keys."""
    problems = []
    problems += engine_problems(cfg.rollout.backend, cfg.sampling.temperature)
    problems += model_problems(cfg)
    if cfg.run.mode not in ("ray", "local"):
        problems.append(f"run.mode must be 'ray' or 'local', not {cfg.run.mode!r}")
    if cfg.rollout.autoscale.enabled and cfg.run.mode != "ray":
        problems.append("rollout.autoscale.enabled needs run.mode=ray (in one process no actor can leave)")
    if cfg.learner.ranks > 1 and cfg.run.mode != "ray":
        problems.append(f"learner.ranks={cfg.learner.ranks} needs run.mode=ray (each rank is a process of its own)")
    problems += observe_problems(cfg.observe)
    problems += prompt_problems(cfg)
    run = cfg.run
    for key, value, ok, wanted in (("max_restarts", run.max_restarts, run.max_restarts >= 1, ">= 1 (run.restart="
                                    "false restarts nothing)"), ("restart_window_s", run.restart_window_s,
                                   run.restart_window_s > 0, "> 0"),
                                   ("restart_backoff_s", run.restart_backoff_s, run.restart_backoff_s >= 0, ">= 0"),
                                   ("ping_timeout_s", run.ping_timeout_s, run.ping_timeout_s > 0, "> 0"),
                                   ("ping_misses", run.ping_misses, run.ping_misses >= 1, ">= 1")):
        if not ok:
            problems.append(f"run.{key}={value}: must be {wanted}")
    for key, count in (("env.count", cfg.env.count), ("rollout.count", cfg.rollout.count),
                       ("learner.ranks", cfg.learner.ranks)):
        if count < 1:
            problems.append(f"{key}={count}: a run needs at least one")
    for group, key in ((cfg.env, "env"), (cfg.rollout, "rollout")):
        if group.count > group.max_count:
            problems.append(f"{key}.count={group.count} is above {key}.max_count={group.max_count}")
    if cfg.rollout.autoscale.enabled and cfg.rollout.autoscale.max_actors > cfg.rollout.max_count:
        problems.append(f"rollout.autoscale.max_actors={cfg.rollout.autoscale.max_actors} is above "
                        f"rollout.max_count={cfg.rollout.max_count}")
    if cfg.league is None:
        if cfg.run.max_matches is not None:
            problems.append("run.max_matches counts a league's rated matches: this run has no league")
        if cfg.eval.opponents:
            problems.append("eval.opponents is a league's list: a single run plays eval.opponent")
    else:
        ids = [m.id for m in cfg.league.members]
        problems += [p for i in ids if (p := name_problem("league member id", i))]
        if not ids or len(set(ids)) != len(ids):
            problems.append(f"league.members need distinct ids, not {ids}")
        if not any(m.role == "main" for m in cfg.league.members):
            problems.append("league.members: a league needs at least one member with role 'main'")
        if cfg.rollout.autoscale.enabled:
            problems.append("rollout.autoscale.enabled: a league scales its members' rollouts by `tidal scale`")
    problems += [p for p in [name_problem("run.policy_id", cfg.run.policy_id)] if p]
    problems += actor_config_problems(cfg)
    if problems:
        raise ValueError("; ".join(problems))


def prompt_problems(cfg: RunConfig) -> list[str]:
    """A prompt template that does not render, or a context that holds no turn."""
    p = cfg.prompt
    try:
        fmt = prompt_format(p.template, p.history, p.system)
    except ValueError as error:
        return [str(error)]
    if fmt.answer and fmt.answer != cfg.env.args.answer.removeprefix(THINK):  # think_<form>: <form> after </think>
        return [f"prompt.template={p.template} asks for the answer in the form {fmt.answer}, but env.args.answer="
                f"{cfg.env.args.answer} reads another: set env.args.answer={fmt.answer} (or {THINK}{fmt.answer})"]
    if p.max_context_tokens is not None and p.max_context_tokens <= cfg.sampling.max_new_tokens:
        return [f"prompt.max_context_tokens={p.max_context_tokens} leaves no room for a prompt and "
                f"sampling.max_new_tokens={cfg.sampling.max_new_tokens}"]
    return []


def model_problems(cfg: RunConfig) -> list[str]:
    """A base model that cannot be made: an unknown ``model.init``, or a shape that does not fit together."""
    if cfg.model.init not in MODEL_INITS:
        return [f"model.init={cfg.model.init!r}: choose one of {', '.join(MODEL_INITS)} (or set model.path)"]
    if cfg.model.init == "random" and not cfg.model.path:
        try:
            random_model_config(cfg)
        except ValueError as error:
            return [str(error)]
    return []


def sampling_stops(cfg: RunConfig) -> list[str]:
    """The run's stop strings: ``sampling.stop``, or (null) the answer form's own."""
    return list(cfg.sampling.stop) if cfg.sampling.stop is not None else default_stops(cfg.env.args.answer)


def actor_config_problems(cfg: RunConfig) -> list[str]:
    """What each actor's own config refuses (its ``__post_init__``), found before any actor starts."""
    groups = {
        "env.args": lambda: EnvConfig(tokenizer_path="", policy_id=cfg.run.policy_id, **built_args(cfg.env.args)),
        "rollout": lambda: RolloutConfig(model_path="", backend=cfg.rollout.backend, stop=sampling_stops(cfg),
                                         **built_args(cfg.rollout.args)),
        "learner": lambda: LearnerConfig(model_path="", max_staleness=cfg.learner.max_staleness,
                                         checkpoint_every=cfg.learner.checkpoint_every,
                                         ranks=max(cfg.learner.ranks, 1), **run_budget(cfg),
                                         **built_args(cfg.learner.args)),
        "reward.args": lambda: RewardConfig(**built_args(cfg.reward.args)),
    }
    if cfg.league is not None:
        groups["league"] = lambda: LeagueConfig(members=[dataclasses.asdict(m) for m in cfg.league.members],
                                                state_dir="", **built_args(cfg.league.args))
    problems = []
    for key, make in groups.items():
        try:
            make()
        except (ValueError, TypeError) as error:
            problems.append(f"{key}: {error}")
    return problems
