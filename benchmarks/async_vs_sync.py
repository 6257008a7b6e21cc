"""What asynchrony buys: time to a reward target at eta = 0 (synchronous) and at eta > 0, same config.

    python benchmarks/async_vs_sync.py [--quick] [--etas 0 2 4] [--target 0.4] [--window 256] [--minutes 12]
                                       [overrides...]

The task is `tool_latency` (envs/tool_latency.py): multi-turn, every tool call takes a log-normal time
(heavy-tailed: median 0.5 s, sigma 1.5, capped at 30 s) and every turn draws its own generation budget, so
episodes vary a lot in length. The tiny model is warmed up on the task (half expert, half random-legal
moves), and starts at a training return of about -0.3 (a forfeit is -1, a right answer 1); the target
is 0.4. A KL penalty to the base model and an entropy bonus keep it from collapsing into answering at
once without a lookup (which it otherwise did after a minute or two at eta = 2: always the same
number, no signal left to learn from). Each eta is a real `tidal launch` (embedded Ray, ZeroMQ streams) that
stops once the policy's mean training return over its last ``--window`` training episodes reaches ``--target``,
or after ``--minutes``.

The window is a count of episodes, the same at every eta, so that every run's return is read with the same
noise. (A run's default window, the last 30 s, holds ~130 episodes of a synchronous run and ~1,700 of an
asynchronous one: the noisier synchronous mean crossed the target earlier than its policy did. Until
2026-11-25 this benchmark used it.)

At eta = 0 every batch waits for its slowest episode and the learner waits for every batch; at eta > 0
the next episodes are already running while the learner trains. Prints one line per eta and ends with:

    speedup=<time at eta=0 / best time at a fixed eta>0> learner_busy=<fraction at that eta> eta=<that eta>
    auto_vs_best=<time with learner.max_staleness=auto / that best time> auto_reached=<1 if auto reached the target>

A run that misses the target counts with its full time, so a synchronous run that never gets there gives
a lower bound on the speedup (said on the line above). `--quick` (about a minute): eta 0 and 2, a few
seconds each, in-process; it checks the harness, its numbers mean little.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from actors.cli import load_config
from actors.cli import launch

TASK = [
    "env=tool_latency", "env.args.concurrency=256", "env.args.max_retries=0", "env.args.env_args.lookups=1",
    "env.args.env_args.latency_median_s=0.5", "env.args.env_args.latency_sigma=1.5",
    "env.args.env_args.latency_max_s=30", "env.args.env_args.min_new_tokens=6",
    "env.args.env_args.max_new_tokens=16", "sampling.max_new_tokens=16", "model.tiny.warmup_expert_share=0.5",
    "replay.args.capacity_episodes=256", "learner.args.lr=0.00025", "learner.args.objective.kl_coef=0.05",
    "learner.args.lr_decay=constant", "learner.args.objective.minibatches=4",  # the settings it was measured with
    "learner.args.objective.entropy_coef=0.01", "learner.args.objective.advantage=rae", "model.tiny.layers=2",
    "model.tiny.hidden_size=128", "model.tiny.heads=4", "model.tiny.intermediate_size=256", "eval.every_s=0",
    "eval.endpoint_games_per_seat=50",
    "run.return_window_s=0", "run.log_every_s=2",  # the return over the last --window episodes, read every 2 s
    # The warm-up plays the task on a mock clock, so tool latencies do not change its demonstrations: it keeps
    # the arguments the cached base model was made with (a new latency would only rebuild the same model).
    "model.tiny.warmup_env=tool_latency",
    "++model.tiny.warmup_env_args={lookups:1,max_turns:6,latency_median_s:0.1,latency_sigma:1.5,latency_max_s:10,"
    "min_new_tokens:6,max_new_tokens:16}",
]


def run_one(eta: int, target: float, minutes: float, out: Path, extra: list[str], window: int = 256) -> dict:
    overrides = [*TASK, f"learner.max_staleness={eta}", f"run.minutes={minutes}", f"run.target_return={target}",
                 f"run.return_window_episodes={window}",
                 "run.progress=false", f"run.dir={out}", f"run.name=eta{eta}", *extra]
    summary = launch(load_config(overrides))
    reached = summary["target_reached_s"]
    return {"eta": eta, "reached": reached is not None,
            "seconds": reached if reached is not None else summary["minutes"] * 60,
            "episodes_per_s": summary["episodes_per_s"] or 0.0, "learner_busy": summary["learner_busy"] or 0.0,
            "rollout_idle": summary["rollout_idle"], "train_return": summary["train_return"],
            "versions": summary["final_version"], "staleness": summary["staleness_hist"],
            "rejected": summary["rejected_episodes"], "rejected_turns": summary["rejected_turns"]}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="eta 0 and 2, seconds each, in-process")
    parser.add_argument("--etas", type=lambda v: v if v == "auto" else int(v), nargs="+", default=[0, 2, 4, "auto"],
                        help="bounds to run: integers, and auto (learner.max_staleness=auto)")
    parser.add_argument("--target", type=float, default=0.4, help="mean training return to reach")
    parser.add_argument("--minutes", type=float, default=12.0, help="the most each run may train")
    parser.add_argument("--window", type=int, default=256, help="training episodes the return is the mean of")
    parser.add_argument("--out", default="runs/bench-async")
    args, overrides = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    etas, minutes = args.etas, args.minutes
    if args.quick:
        etas, minutes, args.window = [0, 2, "auto"], 0.25, min(args.window, 32)
        overrides = ["run.mode=local", "replay.args.batch_episodes=8", "env.args.concurrency=32",
                     "eval.endpoint_games_per_seat=4", "model.tiny.warmup_steps=30", "model.tiny.warmup_games=200",
                     *overrides]
    if 0 not in etas or not any(eta != 0 for eta in etas):
        parser.error("--etas must include 0 and at least one eta > 0")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for eta in etas:
        started = time.time()
        results.append(r := run_one(eta, args.target, minutes, out, overrides, args.window))
        print(f"eta={eta}: {'reached' if r['reached'] else 'missed'} return {args.target} in {r['seconds']:.0f} s "
              f"(last {r['train_return'] if r['train_return'] is not None else float('nan'):.3f}) "
              f"episodes/s={r['episodes_per_s']:.1f} learner_busy={r['learner_busy']:.2f} "
              f"rollout_idle={r['rollout_idle']:.2f} versions={r['versions']} rejected_turns={r['rejected_turns']} "
              f"(whole episodes {r['rejected']}) "
              f"wall={(time.time() - started) / 60:.1f} min", flush=True)
    (out / "async_vs_sync.json").write_text(json.dumps(results, indent=2))
    sync = next(r for r in results if r["eta"] == 0)
    fixed = [r for r in results if r["eta"] not in (0, "auto")]
    best = min(fixed or [r for r in results if r["eta"] != 0], key=lambda r: (not r["reached"], r["seconds"]))
    auto = next((r for r in results if r["eta"] == "auto"), None)
    for r in results:
        if r["eta"] != 0:
            print(f"eta={r['eta']} vs 0: time {sync['seconds'] / r['seconds']:.2f}x, "
                  f"episodes/s {r['episodes_per_s'] / max(sync['episodes_per_s'], 1e-9):.2f}x")
    if not sync["reached"]:
        print(f"eta=0 missed the target in {minutes} min: the speedup below is a lower bound")
    if not best["reached"]:
        print("no eta > 0 reached the target: the speedup below compares time budgets only")
    line = f"speedup={sync['seconds'] / best['seconds']:.2f} learner_busy={best['learner_busy']:.2f} eta={best['eta']}"
    if auto is not None and auto is not best:  # time to the target: auto's over the best fixed eta's (<= 1.1: as fast)
        line += f" auto_vs_best={auto['seconds'] / best['seconds']:.2f} auto_reached={int(auto['reached'])}"
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
