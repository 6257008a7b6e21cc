"""The ``tidal`` command. Only this entry point knows Hydra; components get plain dataclasses."""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import io
import json
import logging
import signal
import sys
from pathlib import Path

from omegaconf import OmegaConf

from actors.runs import config
from actors.runs.config import RunConfig
from actors.runs.driver import Driver
from actors.runs.run_lock import RunInUse
from actors.runs.topology import policy_dir

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


def load_config(overrides: list[str], name: str = "launch") -> RunConfig:
    """Compose ``configs/<name>.yaml`` with Hydra overrides onto the typed schema (``actors/runs/config.py``): a bad
    override, an unknown key or a value of the wrong type fails here, with Hydra's message naming it, and so does
    a contradictory config (``config.check``).

    ``resume=<run dir>`` continues that run instead: its own ``config.json``, with the other overrides
    (plain ``key=value``, e.g. ``run.minutes=5``) applied on top; the keys that reach outside the run
    (``config.OUTSIDE_KEYS``: ``ray.address``, ``model.path``, ...) only from the command line.
    """
    refuse_moved(overrides)
    resume = [o.split("=", 1)[1] for o in overrides if o.startswith("resume=")]
    if resume:
        return resumed_config(resume[-1], [o for o in overrides if not o.startswith("resume=")])
    from hydra import compose, initialize_config_dir

    config.register()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return typed(compose(config_name=name, overrides=overrides))


def typed(composed) -> RunConfig:
    """The composed config as ``RunConfig``, checked (``config.check``); a key the schema does not know
    (Hydra's ``+key=value`` adds one even to a typed node) fails, named."""
    cfg = OmegaConf.to_object(composed)
    unknown = config.unknown_keys(OmegaConf.to_container(composed, resolve=True), dataclasses.asdict(cfg))
    if unknown:
        raise ValueError(f"unknown config keys: {', '.join(unknown)}")
    config.check(cfg)
    return cfg


def refuse_moved(overrides: list[str]) -> None:
    """An override of a key that moved fails naming its new place."""
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if key in config.MOVED:
            raise ValueError(f"{key} is declared once now, as {config.MOVED[key]}: use {config.MOVED[key]}=...")


def resumed_config(run_dir: str, overrides: list[str]) -> RunConfig:
    from actors.models.checkpoint_dir import find_checkpoint

    path = Path(run_dir).expanduser()
    cfg = saved_config(run_dir, overrides, "resume")
    cfg.resume, cfg.run.name, cfg.run.dir = str(path), path.name, str(path.parent)
    for member in cfg.members():  # a league checkpoints every member's learner; a single-policy run its one
        if find_checkpoint(path / policy_dir(cfg, member.id)) is None:
            raise FileNotFoundError(f"resume={run_dir}: the run left no checkpoint "
                                    f"({policy_dir(cfg, member.id)}/trainer_state.pt)")
    return cfg


def saved_config(run_dir: str, overrides: list[str], doing: str, groups: dict[str, str] | None = None) -> RunConfig:
    """A run's own ``config.json`` with plain ``key=value`` ``overrides`` on top, checked; the ``OUTSIDE_KEYS``
    it sets only if given again here (``doing``: what for, in the messages). ``groups``: config group files to
    lay over its sections first (``{"reward": "judge"}``: ``configs/reward/judge.yaml`` as its ``reward``)."""
    path = Path(run_dir).expanduser()
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{doing}={run_dir}: not a run directory (no config.json)")
    saved = migrated(json.loads((path / "config.json").read_text()))
    bad = [o for o in overrides if "=" not in o or o.startswith(("+", "~"))]
    if bad:
        raise ValueError(f"{doing} takes plain key=value overrides, not {', '.join(bad)}")
    given = {o.split("=", 1)[0] for o in overrides}
    outside = {k: v for k, v in config.outside_settings(saved).items() if k not in given}
    if outside:  # a run directory is data: it does not choose the cluster, keys, model or services of the driver
        again = " ".join(config.override(k, v) for k, v in outside.items())
        command = f"tidal launch resume={run_dir}" if doing == "resume" else f"tidal {doing} {run_dir}"
        raise ValueError(f"{doing}={run_dir}: its config.json sets {', '.join(outside)}, which a {doing} takes only "
                         f"from the command line (they reach outside the run directory, which anyone who could write "
                         f"it could have changed); if you trust them, give them again: {command} {again}")
    files = []
    for group, name in (groups or {}).items():
        path = CONFIG_DIR / group / f"{name}.yaml"
        if not name.replace("_", "").isalnum() or not path.exists():
            known = ", ".join(sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml")))
            raise ValueError(f"{group}={name}: no such config (configs/{group}/ has {known})")
        files.append(OmegaConf.create({group: OmegaConf.load(path)}))
    cfg = OmegaConf.merge(OmegaConf.structured(RunConfig), saved, *files, OmegaConf.from_dotlist(overrides))
    return typed(cfg)


def migrated(saved: dict) -> dict:
    """A run's saved config as today's schema reads it: a policy id once declared per group is ``run.policy_id``."""
    for key, new in config.MOVED.items():
        group = saved.get(key.split(".")[0], {}).get("args", {})
        if "policy_id" in group:
            saved.setdefault("run", {})[new.split(".")[1]] = group.pop("policy_id")
    return saved


def dump_stacks_on_sigusr1() -> None:
    """`kill -USR1 <pid>`: every thread's stack to the process's real stderr, for a run that seems to hang.
    Skipped where that stderr has no file descriptor (or the platform no SIGUSR1)."""
    try:
        faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)
    except (AttributeError, ValueError, OSError, io.UnsupportedOperation):
        pass


def main(argv: list[str] | None = None) -> int:
    dump_stacks_on_sigusr1()
    parser = argparse.ArgumentParser(prog="tidal", description="Asynchronous RL for language-model agents.")
    commands = parser.add_subparsers(dest="command", required=True)
    launch_parser = commands.add_parser("launch", help="run a job (default: self-play TicTacToe on an embedded Ray)")
    launch_parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. run.minutes=2 rollout.count=2")
    show = commands.add_parser("config", help="print the composed config")
    show.add_argument("overrides", nargs="*")
    commands.add_parser("envs", help="list the environments and opponents (env.args.env_name=<name>)")
    scale = commands.add_parser("scale", help="change how many actors of a kind a running run has: rollout=4")
    scale.add_argument("counts", nargs="+", help="<kind>=<count>, e.g. rollout=4")
    scale.add_argument("--run", help="the run directory (default: the latest running run under runs/)")
    stop = commands.add_parser("stop", help="end a running run cleanly (metrics, checkpoint, final evaluation, summary)")
    stop.add_argument("--run", help="the run directory (default: the latest running run under runs/)")
    stop.add_argument("--now", action="store_true", help="skip the final evaluation (as Ctrl-C does)")
    top = commands.add_parser("top", help="a live dashboard of a running or finished run (no Ray needed)")
    top.add_argument("run", nargs="?", help="the run directory (default: the latest run under runs/)")
    top.add_argument("--once", action="store_true", help="print one screen and exit")
    export = commands.add_parser("export", help="write a run's trained episodes as Parquet, from its replay spill")
    export.add_argument("run", help="the run directory")
    export.add_argument("--out", help="where (default: the run's episodes/, which must not hold a dataset yet)")
    rerun = commands.add_parser("replay", help="re-run a run's learner from its recorded batches and check every "
                                "version (learner.* overrides: a counterfactual beside it; --rescore: audit rewards)")
    rerun.add_argument("run", help="the run directory, e.g. runs/20261128-101500")
    rerun.add_argument("overrides", nargs="*", help="learner.args.objective.loss=ppo ...: a counterfactual learner; "
                       "reward.args...=...: the scorer --rescore uses")
    rerun.add_argument("--member", help="the league member to replay (a single-policy run has one)")
    rerun.add_argument("--from-version", type=int, help="start from the checkpoint at this version")
    rerun.add_argument("--to-version", type=int, help="stop at this version and save its weights (a checkpoint)")
    rerun.add_argument("--ranks", type=int, help="learner ranks (default: the run's; another count is only close)")
    rerun.add_argument("--eval", help="versions (e.g. 20,40) whose replayed policies the run's evaluation plays")
    rerun.add_argument("--rescore", action="store_true", help="score every trained episode again; count differences")
    rerun.add_argument("--force", action="store_true", help="replay a run recorded by other code")
    league = commands.add_parser("league", help="self-play leagues: run one, or print a run's league table")
    league_commands = league.add_subparsers(dest="league_command", required=True)
    league_run = league_commands.add_parser("run", help="run a league (configs/league.yaml)")
    league_run.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. run.minutes=5 league=liars_dice")
    league_table = league_commands.add_parser("table", help="ratings and payoff matrix of a league run")
    league_table.add_argument("run_dir")
    args, extra = parser.parse_known_args(argv)
    if extra and args.command == "replay" and all("=" in e and not e.startswith("-") for e in extra):
        args.overrides += extra  # overrides after an option (`--rescore reward=judge`)
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "scale":
        return scale_command(args.counts, args.run)
    if args.command == "stop":
        return stop_command(args.run, evaluate=not args.now)
    if args.command in ("top", "export"):
        return top_command(args.run, args.once) if args.command == "top" else export_command(args.run, args.out)
    if args.command == "replay":
        return replay_command(args)
    if args.command == "envs":
        from envs.registry import listing

        print(listing())
        return 0
    if args.command == "league" and args.league_command == "table":
        return print_league_table(args.run_dir)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        cfg = load_config(args.overrides, "league" if args.command == "league" else "launch")
    except Exception as error:  # Hydra's errors (and check's) name the bad key or value
        print(f"tidal: bad config: {error}", file=sys.stderr)
        return 2
    if args.command == "config":
        print(json.dumps(dataclasses.asdict(cfg), indent=2))
        return 0
    try:
        summary = launch(cfg)
    except RunInUse as error:  # a resume of a run whose driver is still running
        print(f"tidal: {error}", file=sys.stderr)
        return 2
    if cfg.league is not None:
        print_league_table(summary["run_dir"])
    else:
        print_summary(summary)
    return 130 if summary["interrupted"] else 0


def launch(cfg: RunConfig) -> dict:
    """Run the job ``cfg`` describes (a single policy or a league: one driver); returns (and writes) its
    summary. Ctrl-C ends it cleanly."""
    return Driver(cfg).execute()


def scale_command(counts: list[str], run_dir: str | None) -> int:
    """``tidal scale rollout=4``: ask a running run for that many actors; prints its answer."""
    from actors.runs.control import latest_run, send_scale

    try:
        wanted = [parse_count(c) for c in counts]
        run = Path(run_dir) if run_dir else latest_run("runs")
        for actor, count in wanted:
            answer = send_scale(run, actor, count)
            print(f"{run}: {answer.message}" + (f" (from {answer.actors})" if answer.ok else ""))
            if not answer.ok:
                return 1
    except (ValueError, OSError) as error:
        print(f"tidal scale: {error}", file=sys.stderr)
        return 2
    return 0


def stop_command(run_dir: str | None, evaluate: bool = True) -> int:
    """``tidal stop``: end a running run as its budget would (``evaluate``: with its final evaluation)."""
    from actors.runs.control import latest_run, send_stop

    try:
        run = Path(run_dir) if run_dir else latest_run("runs")
        answer = send_stop(run, evaluate)
    except (ValueError, OSError) as error:
        print(f"tidal stop: {error}", file=sys.stderr)
        return 2
    print(f"{run}: {answer.message}")
    return 0 if answer.ok else 1


def top_command(run: str | None, once: bool) -> int:
    """``tidal top``: the run's screen, redrawn until it finishes (``once``: printed once)."""
    from rich.console import Console

    from actors.runs.dashboard import find_run, render, watch

    try:
        run_dir = find_run(run)
    except FileNotFoundError as error:
        print(f"tidal top: {error}", file=sys.stderr)
        return 2
    if once:
        Console().print(render(run_dir))
    else:
        try:
            watch(run_dir)
        except KeyboardInterrupt:
            pass
    return 0


def export_command(run: str, out: str | None) -> int:
    """``tidal export``: a run's trained episodes from its spill, as the episode dataset."""
    from actors.observe.export import export_run
    from actors.runs.run_lock import RunLock

    try:
        if not Path(run).expanduser().is_dir():
            raise FileNotFoundError(f"{run} is not a run directory")
        with RunLock(Path(run).expanduser(), "tidal export"):  # not while its driver writes the spill
            counts = export_run(run, out)
    except (FileNotFoundError, FileExistsError, ValueError, RunInUse) as error:
        print(f"tidal export: {error}", file=sys.stderr)
        return 2
    print(f"{counts['episodes']} trained episodes in {counts['batches']} batches written to {counts['dir']}; not "
          f"written: {counts['compacted']} episodes the spill had compacted (ids only), "
          f"{counts['incomplete_batches']} batches naming an episode not on disk")
    return 0


def replay_command(args) -> int:
    """``tidal replay <run>``: the learner re-run and checked, a counterfactual beside it, or a reward audit."""
    from actors.learner.rerun import ReplayRefused
    from actors.runs import replaying

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    outside = [o for o in args.overrides if o.split("=", 1)[0] in config.OUTSIDE_KEYS]
    learner = [o for o in args.overrides if o.startswith("learner.")]
    reward = [o for o in args.overrides if o.startswith("reward.")]
    scorer = {"reward": o.split("=", 1)[1] for o in args.overrides if o.startswith("reward=")}  # a group file
    other = [o for o in args.overrides if o not in outside + learner + reward and not o.startswith("reward=")]
    try:
        if other or ((reward or scorer) and not args.rescore) or (learner and args.rescore):
            raise ValueError(f"replay takes learner.* overrides (a counterfactual), reward=<config> and reward.* ones "
                             f"with --rescore, and "
                             f"{', '.join(config.OUTSIDE_KEYS)}; not {', '.join(other or reward or learner or ['reward=' + scorer['reward']])}")
        if args.rescore:
            counts = replaying.rescore_run(args.run, saved_config(args.run, outside + reward, "replay", scorer),
                                           args.member)
            print(" ".join(f"{k}={v}" for k, v in counts.items()))
            return 0
        recorded = saved_config(args.run, outside, "replay")
        counter = saved_config(args.run, outside + learner, "replay") if learner else None
        result = replaying.replay(args.run, recorded, counter, args.member, args.from_version, args.to_version,
                                  args.force, " ".join(learner), args.ranks, parse_versions(args.eval))
    except (ReplayRefused, ValueError, FileNotFoundError) as error:
        print(f"tidal replay: {error}", file=sys.stderr)
        return 2
    print(replay_line(result))
    return 1 if result["divergence"] else 0


def parse_versions(text: str | None) -> tuple[int, ...]:
    """``--eval 20,40``: the versions, each a whole number >= 1."""
    if not text:
        return ()
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isascii() and p.isdigit() and 0 < len(p) < 10 and int(p) > 0 for p in parts):
        raise ValueError(f"--eval {text!r}: expected versions as whole numbers >= 1, e.g. --eval 20,40")
    return tuple(sorted({int(p) for p in parts}))


def replay_line(result: dict) -> str:
    said = (f"{result['run']}: versions {result['from_version']}..{result['reached_version']} replayed, "
            f"digests_equal={result['digests_equal']:.3f} replay_s={result['replay_s']:.1f} "
            f"run_learner_s={result['run_learner_s']:.1f}")
    if result["divergence"]:
        said += f"\n{result['divergence']}"
    if result.get("counterfactual"):
        said += f"\ncounterfactual ({result['counterfactual']}): KL at the last version {result['counterfactual_kl']}"
        said += f", report in {result['report']}"
    for e in result.get("evaluations", []):
        said += f"\nversion {e['version']}: non-loss " + ", ".join(f"{side} {e[side]['nonloss']:.3f}" for side in
                                                                  ("recorded", "counterfactual") if side in e)
    if result.get("saved"):
        said += f"\nweights at version {result['reached_version']}: {result['saved']}"
    return said + f"\noutputs: {result['out']}"


def parse_count(text: str) -> tuple[str, int]:
    actor, _, count = text.partition("=")
    if not actor or not (count.isascii() and count.isdigit()) or len(count) > 9:
        raise ValueError(f"{text!r}: expected <kind>=<count>, e.g. rollout=4")
    return actor, int(count)


def print_league_table(run_dir: str) -> int:
    """Print a league run's ratings and payoff matrix; write its ratings-over-time plot beside its state."""
    from actors.league.actor import load_state
    from actors.league.table import format_table, plot_ratings

    try:
        state = load_state(Path(run_dir).expanduser())
    except (FileNotFoundError, ValueError) as error:
        print(f"tidal: {error}", file=sys.stderr)
        return 2
    print(format_table(state))
    plot = Path(run_dir).expanduser() / "league" / "ratings.png"
    plot_ratings(state, plot)
    print(f"ratings over time: {plot}")
    return 0


def print_summary(summary: dict) -> None:
    def fmt(x):
        return "-" if x is None else f"{x:.3f}"

    print(f"\nrun directory: {summary['run_dir']}")
    print(f"policy version {summary['final_version']} after {summary['episodes']} episodes "
          f"in {summary['minutes']:.1f} min ({fmt(summary['episodes_per_s'])} episodes/s)")
    print(f"non-loss vs random: start {fmt(summary['start_nonloss'])}  final {fmt(summary['final_nonloss'])}")
    print(f"metrics: {summary['run_dir']}/metrics.jsonl   curve: {summary['run_dir']}/learning_curve.png")


if __name__ == "__main__":
    sys.exit(main())
