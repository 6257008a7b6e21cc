"""How much does staleness cost, with and without off-policy correction?

    python benchmarks/staleness.py [--quick] [--seeds 3] [--etas 0 2 4 8 auto] [--versions 100] [overrides...]

On TicTacToe against the random opponent (a task the tiny model learns in minutes), trains the same
config for the same number of learner updates at each staleness bound eta, once with the decoupled PPO
loss (AReaL's correction) and once with naive PPO (clipping pi/mu, the behaviour policy as the old
policy), and measures the final non-loss rate against random. Each run is a real `tidal launch` (embedded
Ray, ZeroMQ streams). Prints a table, writes `staleness.png` and `staleness.json` to the output directory,
and ends with one line:

    decoupled_eta4_vs_eta0=<mean final at eta 4 / at eta 0, decoupled> decoupled_min_final=<the lowest final of
    any decoupled run at eta <= 4> [decoupled_eta8_vs_eta0=<the same at eta 8, when run>]
    decoupled_min_final_any=<the lowest final of any decoupled run> decoupled_guard_trips=<the collapse guard's
    trips over them> naive_eta4_vs_eta0=<the same ratio, naive> auto_vs_eta0=<decoupled with max_staleness=auto /
    eta 0>

The default job's stop strings apply (``sampling.stop`` null: the first ``]``, the move's end), so a move's tokens
after its closing bracket are never sampled, nor trained.

With ``--seeds N`` every cell runs N times (seeds 0..N-1) and the table gives each cell's mean, minimum and 95%
interval; the ratios are of means. ``auto`` (the adaptive bound) runs with the decoupled loss only.

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


def run_one(loss: str, eta, versions: int, out: Path, extra: list[str], seed: int = 0) -> dict:
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
            "learner_busy": summary["learner_busy"], "guard_trips": summary.get("guard_trips", 0),
            "eta_last": summary.get("eta_last"), "run_dir": summary["run_dir"]}


T95 = {2: 12.71, 3: 4.30, 4: 3.18, 5: 2.78, 6: 2.57, 7: 2.45, 8: 2.36, 9: 2.31, 10: 2.26}  # Student's t, 95%, n-1 dof


def cell(finals: list[float]) -> dict:
    """A cell's runs: mean, minimum and the half-width of a 95% confidence interval of the mean (t-interval)."""
    mean = statistics.mean(finals)
    half = T95.get(len(finals), 1.96) * statistics.stdev(finals) / len(finals) ** 0.5 if len(finals) > 1 else None
    return {"mean": mean, "min": min(finals), "ci95": half, "n": len(finals)}


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for loss in sorted({r["loss"] for r in results}):
        rows = [r for r in results if r["loss"] == loss and r["eta"] != "auto"]
        etas = sorted({r["eta"] for r in rows})
        means = [statistics.mean(r["final"] for r in rows if r["eta"] == eta) for eta in etas]
        line, = ax.plot(etas, means, "-", label=f"{loss} (mean)")
        ax.plot([r["eta"] for r in rows], [r["final"] for r in rows], "o", color=line.get_color(), alpha=0.5)
    auto = [r["final"] for r in results if r["eta"] == "auto"]
    if auto:
        ax.axhline(statistics.mean(auto), linestyle="--", color="gray", label="decoupled, eta=auto (mean)")
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


def eta_arg(value: str):
    return "auto" if value == "auto" else int(value)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="eta 0 and 4, a few updates, in-process (about a minute)")
    parser.add_argument("--etas", type=eta_arg, nargs="+", default=[0, 2, 4, 8, "auto"],
                        help="bounds to run (integers, and auto: the adaptive bound, with the decoupled loss only)")
    parser.add_argument("--versions", type=int, default=100, help="learner updates per run")
    parser.add_argument("--losses", nargs="+", choices=list(LOSSES), default=list(LOSSES),
                        help="which losses to run (the last line gives the ratios of those run)")
    parser.add_argument("--seeds", type=int, default=1, help="runs per (loss, eta), seeds 0..: a cell's mean, minimum "
                        "and 95%% interval; one run's final varies by about 0.1 here")
    parser.add_argument("--first-seed", type=int, default=0, help="seeds first-seed.. (more seeds for a table)")
    parser.add_argument("--out", default="runs/bench-staleness")
    args, overrides = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    etas, versions = args.etas, args.versions
    if args.quick:
        etas, versions = [0, 4, "auto"], 4
        overrides = ["run.mode=local", "replay.args.batch_episodes=8", "replay.args.capacity_episodes=16",
                     "env.args.concurrency=16", "eval.endpoint_games_per_seat=10", "model.tiny.warmup_steps=30",
                     "model.tiny.warmup_games=200", *overrides]
    if 0 not in etas or 4 not in etas:
        parser.error("--etas must include 0 and 4 (the ratios compare them)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cells = [(loss, eta) for loss in args.losses for eta in etas if eta != "auto" or loss == "decoupled"]
    results = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):  # seeds outermost: a cut-short benchmark still has every cell once
        for loss, eta in cells:
            results.append(run_one(loss, eta, versions, out, overrides, seed))
            r = results[-1]
            print(f"{loss:>9} eta={eta} seed={seed}: final_nonloss={r['final']:.3f} (start {r['start']:.3f}) "
                  f"versions={r['versions']} staleness_mean={staleness_mean(r['staleness']):.2f} "
                  f"rejected={r['rejected']} guard_trips={r['guard_trips']} eta_last={r['eta_last']} "
                  f"minutes={r['minutes']:.1f}  {r['run_dir']}", flush=True)
    (out / "staleness.json").write_text(json.dumps(results, indent=2))
    plot(results, out / "staleness.png")
    table = {key: cell([r["final"] for r in results if (r["loss"], r["eta"]) == key]) for key in cells}
    print(f"\n{'cell':>16} {'mean':>6} {'min':>6} {'95% CI':>8}   ({args.seeds} seed(s) each)")
    for (loss, eta), c in table.items():
        ci = f"±{c['ci95']:.3f}" if c["ci95"] is not None else "-"
        print(f"{loss + ' eta=' + str(eta):>16} {c['mean']:>6.3f} {c['min']:>6.3f} {ci:>8}")
    print(f"table: {out / 'staleness.json'}  plot: {out / 'staleness.png'}")
    ratio = {loss: table[(loss, 4)]["mean"] / max(table[(loss, 0)]["mean"], 1e-9) for loss in args.losses}
    line = []
    if "decoupled" in ratio:
        decoupled = [r for r in results if r["loss"] == "decoupled"]
        lowest = min(r["final"] for r in decoupled if r["eta"] != "auto" and r["eta"] <= 4)
        line += [f"decoupled_eta4_vs_eta0={ratio['decoupled']:.3f}", f"decoupled_min_final={lowest:.3f}"]
        if ("decoupled", 8) in table:
            eta8 = table[("decoupled", 8)]["mean"] / max(table[("decoupled", 0)]["mean"], 1e-9)
            line.append(f"decoupled_eta8_vs_eta0={eta8:.3f}")
        line.append(f"decoupled_min_final_any={min(r['final'] for r in decoupled):.3f}")  # any eta run, auto too
        line.append(f"decoupled_guard_trips={sum(r['guard_trips'] for r in decoupled)}")
    if "naive" in ratio:
        line.append(f"naive_eta4_vs_eta0={ratio['naive']:.3f}")
    if ("decoupled", "auto") in table:
        line.append(f"auto_vs_eta0={table[('decoupled', 'auto')]['mean'] / max(table[('decoupled', 0)]['mean'], 1e-9):.3f}")
    print(" ".join(line))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
