"""Replay a run exactly: the default job, killed and resumed in the middle with a forced guard rollback, re-run
from its records; then again with naive PPO beside it; then its rewards audited.

    python benchmarks/replay.py [--quick] [--out DIR] [hydra overrides...]
    python benchmarks/replay.py --group     # a run of two learner ranks replayed on two (bitwise) and one (close)

The run: the default job (mirror self-play TicTacToe) for 3 minutes of training (``--quick``: 1), checkpointing
every 5 versions, with the collapse guard forced to trip at version 15 (``learner.args.guard.trip_at``: it rolls
back to its anchor). Its first life runs in one process (``run.mode=local``) and is killed with SIGKILL halfway;
``tidal launch resume=`` finishes it on an embedded Ray. Then, in this process:

1. ``tidal replay``'s faithful re-run: every version's weights digest against the ledger's;
2. the same with ``learner.args.objective.loss=naive_ppo`` beside it (the counterfactual's KL at the last version);
3. ``--rescore`` with the run's scorer.

Last line: ``versions=<n> digests_equal=<share> replay_s=<s> run_learner_s=<s> replay_vs_learner=<ratio>
counterfactual_kl=<KL> rescored_differ=<n>``, with the rollback, the restart and the kill on the line before.

``--group``: ``group_versions=<n> group_digests_equal=<share> one_rank_digests_equal=<share>
one_rank_max_abs_diff=<x> one_rank_rel_diff=<x> trained_rel_change=<x>``: the weights a one-rank replay reaches
at the run's last version against the two-rank replay's (L2 of the difference over the weights' L2), beside how
far training moved them from version 1 there.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from actors.cli import saved_config  # noqa: E402
from actors.learner.ledger import ledger_path, read_ledger  # noqa: E402
from actors.runs import replaying  # noqa: E402

TRIP_AT = 15


def checkpointed_version(run: Path) -> int:
    import torch

    from actors.models.checkpoint_dir import TRAINER_STATE, find_checkpoint

    checkpoint = find_checkpoint(run / "policy")
    try:
        return torch.load(checkpoint / TRAINER_STATE, weights_only=True)["version"] if checkpoint else 0
    except (OSError, RuntimeError, EOFError):  # being swapped in right now
        return 0


def record(out: Path, minutes: float, overrides: list[str]) -> Path:
    """The run, killed halfway (after a checkpoint past the forced trip) and resumed to its budget."""
    run = out / "replayed"
    common = [f"learner.args.guard.trip_at=[{TRIP_AT}]", "learner.checkpoint_every=5", "run.progress=false"]
    first = subprocess.Popen([sys.executable, "-m", "actors.cli", "launch", f"run.dir={out}", "run.name=replayed",
                              "run.mode=local", "run.local_transport=zmq", f"run.minutes={minutes}", *common,
                              *overrides], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60 * (minutes + 10)
    while checkpointed_version(run) < TRIP_AT + 5 or not (run / "metrics.jsonl").exists() or (
            elapsed(run) < 30 * minutes):
        if first.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the run's first life ended or stalled before its kill: {first.stderr.read()[-3000:]}")
        time.sleep(0.5)
    os.kill(first.pid, signal.SIGKILL)
    first.communicate(timeout=60)
    resumed = subprocess.run([sys.executable, "-m", "actors.cli", "launch", f"resume={run}", *common,
                              *[o for o in overrides if o.startswith("model.path=")]],
                             cwd=ROOT, capture_output=True, text=True, timeout=60 * (minutes + 15))
    if resumed.returncode != 0:
        raise RuntimeError(f"the resumed run failed: {resumed.stderr[-3000:]}")
    return run


def elapsed(run: Path) -> float:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    try:
        return json.loads(lines[-1])["elapsed_s"] if lines else 0.0
    except (ValueError, KeyError):
        return 0.0


def group(out: Path, minutes: float, overrides: list[str]) -> str:
    """``--group``: a run of two learner ranks, replayed on two (bitwise) and on one (close): how close."""
    from safetensors.torch import load_file

    run = out / "group"
    done = subprocess.run([sys.executable, "-m", "actors.cli", "launch", f"run.dir={out}", "run.name=group",
                           "learner.ranks=2", f"run.minutes={minutes}", "run.progress=false", *overrides], cwd=ROOT,
                          capture_output=True, text=True, timeout=60 * (minutes + 15))
    if done.returncode != 0:
        raise RuntimeError(f"the two-rank run failed: {done.stderr[-3000:]}")
    given = [o for o in overrides if o.startswith("model.path=")]
    cfg = saved_config(str(run), given, "replay")
    last = max(e["version"] for e in read_ledger(ledger_path(run / "episodes", "main")))
    two = replaying.replay(run, cfg, to_version=last)
    one = replaying.replay(run, cfg, to_version=last, ranks=1)
    a, b = (load_file(Path(r["saved"]) / "model.safetensors") for r in (two, one))
    first = replaying.replay(run, cfg, to_version=1)
    a1 = load_file(Path(first["saved"]) / "model.safetensors")

    def norm(weights) -> float:
        return float(sum((w.double() ** 2).sum() for w in weights.values()) ** 0.5)

    diff = norm({k: a[k] - b[k] for k in a}) / norm(a)
    moved = norm({k: a[k] - a1[k] for k in a}) / norm(a1)
    max_abs = max(float((a[k] - b[k]).abs().max()) for k in a)
    return (f"group_versions={two['versions']} group_digests_equal={two['digests_equal']:.3f} "
            f"one_rank_digests_equal={one['digests_equal']:.3f} one_rank_max_abs_diff={max_abs:.3g} "
            f"one_rank_rel_diff={diff:.3g} trained_rel_change={moved:.3g}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 minute of training instead of 3 (CI)")
    parser.add_argument("--out", help="where the run goes (default: a fresh temporary directory)")
    parser.add_argument("--group", action="store_true", help="instead: a two-rank run, replayed on two ranks and one")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    out = Path(args.out or tempfile.mkdtemp(prefix="tidal-replay-"))
    if args.group:
        print(group(out, 1.0, args.overrides))
        return 0
    run = record(out, 1.0 if args.quick else 3.0, args.overrides)
    given = [o for o in args.overrides if o.startswith("model.path=")]
    entries = read_ledger(ledger_path(run / "episodes", "main"))
    starts = [(e["version"], e["from"]) for e in entries if e["kind"] == "start"]
    rollbacks = [e["version"] for e in entries if e["kind"] == "update" and e["guard"]["rollback"]]
    faithful = replaying.replay(run, saved_config(str(run), given, "replay"))
    counter = replaying.replay(run, saved_config(str(run), given, "replay"),
                               saved_config(str(run), given + ["learner.args.objective.loss=naive_ppo"], "replay"),
                               label="learner.args.objective.loss=naive_ppo")
    audit = replaying.rescore_run(run, saved_config(str(run), given, "replay"))
    print(f"run={run} starts={starts} rollbacks={rollbacks} divergence={faithful['divergence']} "
          f"counterfactual_report={counter['report']} rescored_episodes={audit['episodes']} "
          f"partial={audit['partial']} inconsistent={audit['inconsistent']}")
    ratio = faithful["replay_s"] / faithful["run_learner_s"] if faithful["run_learner_s"] else float("nan")
    print(f"versions={faithful['versions']} digests_equal={faithful['digests_equal']:.3f} "
          f"replay_s={faithful['replay_s']:.1f} run_learner_s={faithful['run_learner_s']:.1f} "
          f"replay_vs_learner={ratio:.2f} counterfactual_kl={counter['counterfactual_kl']:.4g} "
          f"rescored_differ={audit['rescored_differ']}")
    return 0 if faithful["digests_equal"] == 1.0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
