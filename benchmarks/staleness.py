"""How much does staleness cost, with and without off-policy correction?

    python benchmarks/staleness.py [--quick] [--etas 0 2 4 8] [--versions 100] [hydra overrides...]

On TicTacToe against the random opponent (a task the tiny model learns in minutes), trains the same
config for the same number of learner updates at each staleness bound eta, once with the decoupled PPO
loss (AReaL's correction) and once with naive PPO (clipping pi/mu, the behaviour policy as the old
policy), and measures the final non-loss rate against random. Each run is a real `tidal launch` (embedded
Ray, ZeroMQ streams). Prints a table, writes `staleness.png` and `staleness.json` to the output directory,
and ends with one line:

    decoupled_eta4_vs_eta0=<final at eta 4 / final at eta 0, decoupled> naive_eta4_vs_eta0=<the same, naive>

Equal updates, not equal time: the question is what stale data does to each update; `async_vs_sync.py`
measures the time that asynchrony saves. `--quick` (about a minute) runs eta 0 and 4 for a few updates in
the in-process mode: it checks the harness, its ratios mean little.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path

from actors.cli import load_config
from actors.cli import launch

LOSSES = {"decoupled": "decoupled_ppo", "naive": "ppo"}
# The settings its table in benchmarks/RESULTS.md was measured with (the default job's until 2026-11-25): games against random,
# the 2 x 128 base model warmed up on random moves, RAE's baseline per seat.
MEASURED_WITH = ["env.args.opponent=random", "learner.args.objective.advantage=rae", "model.tiny.layers=2",
                 "model.tiny.hidden_size=128", "model.tiny.heads=4", "model.tiny.intermediate_size=256",
                 "model.tiny.warmup_expert_share=0.0"]


def run_one(loss: str, eta: int, versions: int, out: Path, extra: list[str], seed: int = 0) -> dict:
    overrides = [
        f"learner.args.objective.loss={LOSSES[loss]}", f"learner.max_staleness={eta}",
        f"run.max_versions={versions}", "run.minutes=60", "run.progress=false", "eval.every_s=0",
        "env.args.opponent_share=1.0", *MEASURED_WITH, f"run.dir={out}", f"run.name={loss}-eta{eta}-seed{seed}",
        f"run.seed={seed}",
        *extra,
    ]
    started = time.time()
    summary = launch(load_config(overrides))
    return {"loss": loss, "eta": eta, "seed": seed, "final": summary["final_nonloss"], "start": summary["start_nonloss"],
            "versions": summary["final_version"], "minutes": (time.time() - started) / 60,
            "staleness": summary["staleness_hist"], "rejected": summary["rejected_episodes"],
            "learner_busy": summary["learner_busy"]}


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for loss in sorted({r["loss"] for r in results}):
        rows = [r for r in results if r["loss"] == loss]
        etas = sorted({r["eta"] for r in rows})
        means = [statistics.mean(r["final"] for r in rows if r["eta"] == eta) for eta in etas]
        line, = ax.plot(etas, means, "-", label=f"{loss} (mean)")
        ax.plot([r["eta"] for r in rows], [r["final"] for r in rows], "o", color=line.get_color(), alpha=0.5)
    ax.set(xlabel="max staleness eta (versions)", ylabel="final non-loss vs random", ylim=(0, 1.02),
           title="equal learner updates at each eta")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def staleness_mean(hist: dict) -> float:
    tokens = sum(hist.values())
    return sum(int(k) * v for k, v in hist.items()) / tokens if tokens else 0.0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="eta 0 and 4, a few updates, in-process (about a minute)")
    parser.add_argument("--etas", type=int, nargs="+", default=[0, 2, 4, 8])
    parser.add_argument("--versions", type=int, default=100, help="learner updates per run")
    parser.add_argument("--losses", nargs="+", choices=list(LOSSES), default=list(LOSSES),
                        help="which losses to run (the last line gives the ratios of those run)")
    parser.add_argument("--seeds", type=int, default=1,
                        help="runs per (loss, eta), seeds 0.., averaged: one run's final varies by about 0.1 here")
    parser.add_argument("--out", default="runs/bench-staleness")
    args, overrides = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    etas, versions = args.etas, args.versions
    if args.quick:
        etas, versions = [0, 4], 4
        overrides = ["run.mode=local", "replay.args.batch_episodes=8", "replay.args.capacity_episodes=16",
                     "env.args.concurrency=16", "eval.endpoint_games_per_seat=10", "model.tiny.warmup_steps=30",
                     "model.tiny.warmup_games=200", *overrides]
    if 0 not in etas or 4 not in etas:
        parser.error("--etas must include 0 and 4 (the ratios compare them)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for seed in range(args.seeds):  # seeds outermost: a cut-short benchmark still has every (loss, eta) once
        for loss in args.losses:
            for eta in etas:
                results.append(run_one(loss, eta, versions, out, overrides, seed))
                r = results[-1]
                print(f"{loss:>9} eta={eta} seed={seed}: final_nonloss={r['final']:.3f} (start {r['start']:.3f}) "
                      f"versions={r['versions']} staleness_mean={staleness_mean(r['staleness']):.2f} "
                      f"rejected={r['rejected']} minutes={r['minutes']:.1f}", flush=True)
    (out / "staleness.json").write_text(json.dumps(results, indent=2))
    plot(results, out / "staleness.png")
    final = {key: statistics.mean(r["final"] for r in results if (r["loss"], r["eta"]) == key)
             for key in {(r["loss"], r["eta"]) for r in results}}
    print(f"\n{'eta':>4} " + " ".join(f"{loss:>10}" for loss in args.losses) + f"   (mean final of {args.seeds} seed(s))")
    for eta in etas:
        print(f"{eta:>4} " + " ".join(f"{final[(loss, eta)]:>10.3f}" for loss in args.losses))
    print(f"table: {out / 'staleness.json'}  plot: {out / 'staleness.png'}")
    print(" ".join(f"{loss}_eta4_vs_eta0={final[(loss, 4)] / max(final[(loss, 0)], 1e-9):.3f}" for loss in args.losses))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
