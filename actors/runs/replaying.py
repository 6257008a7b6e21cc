"""``tidal replay <run>``: a run's learner re-run from its records (``actors/learner/rerun.py``), a counterfactual
beside it, or its rewards audited (``actors/reward/rescore.py``). One process, no Ray; everything it writes goes
to ``<run>/replays/<stamp>/``. docs/replay.md says what it checks and what it cannot."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from actors.learner.rerun import REPLAYS_DIR, Recorded, ReplayRefused, Rerun, checkpoints_at, load_batch, open_recorded
from actors.reward.actor import RewardConfig
from actors.reward.rescore import rescore
from actors.runs.config import RunConfig, built_args
from actors.runs.driver import base_model_path
from actors.runs.topology import learner_config, plan_groups


def replay_out(run_dir: Path) -> Path:
    """A fresh directory for one replay's outputs."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out, n = run_dir / REPLAYS_DIR / stamp, 1
    while out.exists():
        n += 1
        out = run_dir / REPLAYS_DIR / f"{stamp}-{n}"
    out.mkdir(parents=True)
    return out


def learner_of(cfg: RunConfig, run_dir: Path, member: str):
    """The learner config the run gave ``member``'s learner (as its topology builds it), and its policy dir."""
    groups = plan_groups(cfg, str(base_model_path(cfg)), run_dir)
    if member not in groups:
        raise ReplayRefused(f"member {member!r} is not in the run's config (it has {', '.join(groups)})")
    return learner_config(cfg, groups[member], life=""), groups[member].policy_dir


def replay(run_dir: str | Path, cfg: RunConfig, counter: RunConfig | None = None, member: str | None = None,
           from_version: int | None = None, to_version: int | None = None, force: bool = False,
           label: str = "", ranks: int | None = None, evaluate_at: tuple[int, ...] = ()) -> dict:
    """Re-run the learner of ``run_dir`` (config ``cfg``, the run's own) and check every version's digest; with
    ``counter``, a counterfactual learner beside it; ``ranks``: another learner group size than the run's (its
    digests are counted, not stopped at: docs/replay.md); ``evaluate_at``: versions at which the replayed policies
    (the recorded one, and the counterfactual) are evaluated as the run evaluates its policy. The result (also
    ``result.json`` in the replay's directory)."""
    recorded = open_recorded(run_dir, member)
    learner, policy_dir = learner_of(cfg, recorded.run_dir, recorded.member)
    checkpoint = None
    if from_version is not None:
        found = checkpoints_at(recorded.run_dir, policy_dir)
        if from_version not in found:
            raise ReplayRefused(f"no checkpoint at version {from_version}; there are checkpoints at "
                                f"{sorted(found) or 'no version'} (a replay with --to-version N leaves one at N)")
        checkpoint = found[from_version]
    counter_learner = learner_of(counter, recorded.run_dir, recorded.member)[0] if counter is not None else None
    out = replay_out(recorded.run_dir)
    if evaluate_at and cfg.league is not None:
        raise ReplayRefused("--eval evaluates a single policy's run (a league's members are rated by its matches)")
    rerun = Rerun(recorded, learner, out, counter_learner, checkpoint, to_version, force, ranks=ranks,
                  policies_at=evaluate_at)
    result = {"run": str(recorded.run_dir), "member": recorded.member, "out": str(out), **rerun.run()}
    if evaluate_at:
        result["evaluations"] = [{"version": v, **{side: evaluated(cfg, path, out / f"eval-{side}-v{v}")
                                                   for side, path in rerun.policies[v].items()}}
                                 for v in sorted(rerun.policies)]
        missing = sorted(set(evaluate_at) - set(rerun.policies))
        if missing:
            result["not_evaluated"] = missing  # past where the replay reached
    if counter is not None:
        last = rerun.rows[-1] if rerun.rows else {}
        result.update(counterfactual=label, counterfactual_kl=last.get("kl_recorded_to_counterfactual"),
                      report=str(out / "report.md"))
    rerun.write_report(result)
    return result


def evaluated(cfg: RunConfig, policy: str, where: Path) -> dict:
    """``policy`` (a model directory) evaluated by the run's evaluation (its opponent, its endpoint games per seat)
    through the env actor, in a run of its own with no training budget (``run.minutes=0``, one process): its
    non-loss rate, before any update."""
    from actors.runs.driver import Driver

    run = dataclasses.replace(cfg.run, minutes=0.0, mode="local", dir=str(where.parent), name=where.name,
                              progress=False, max_versions=None)
    observe = dataclasses.replace(cfg.observe, tensorboard=False, dataset=False, wandb=False)
    learner = dataclasses.replace(cfg.learner, args=dataclasses.replace(cfg.learner.args, lr_decay="constant"))
    summary = Driver(dataclasses.replace(cfg, run=run, observe=observe, resume=None, learner=learner,
                                         model=dataclasses.replace(cfg.model, path=policy))).execute()
    # the start evaluation: before any update (the closing one may come after one the run's brief start made)
    return {"nonloss": summary["start_nonloss"], "games_per_seat": cfg.eval.endpoint_games_per_seat, "policy": policy}


def trained_batches(recorded: Recorded):
    """Each update's ledger entry with the batch it trained, in order."""
    for entry in recorded.entries:
        if entry["kind"] == "update":
            yield entry, load_batch(recorded, entry["batch"])


def rescore_run(run_dir: str | Path, cfg: RunConfig, member: str | None = None) -> dict:
    """Score every trained episode of ``run_dir`` again with ``cfg``'s reward config (the run's, or one given on
    the command line); the counts (also ``rescore.json``)."""
    recorded = open_recorded(run_dir, member)
    out = replay_out(recorded.run_dir)
    reward = RewardConfig(tokenizer_path=str(base_model_path(cfg)), **built_args(cfg.reward.args))
    counts = {"run": str(recorded.run_dir), "member": recorded.member, "out": str(out),
              **rescore(trained_batches(recorded), reward, out)}
    (out / "rescore.json").write_text(json.dumps(counts, indent=2))
    return counts
