"""Scaling on a latency-bound task: episodes/s of one run with 1, then 2, then 4 rollout (or env) actors.

    python benchmarks/scaling.py [--quick] [--kind rollout|env] [--latency-s 0.25] [--max-batch 2] [--counts 1,2,4]
                                 [--phase-s 45] [--out runs/scaling] [overrides...]

The default job (self-play TicTacToe) on an embedded Ray cluster, where every batch a rollout actor samples takes
``latency_s`` on top of sampling (``rollout.args.latency_s``: a remote or much larger engine) and holds at most
``max_batch`` requests: one actor answers at most ``max_batch / latency_s`` requests a second, however idle the
machine's cores are, so this task is bound by generation latency, not by CPU. The run starts with the first
count of rollout actors and is scaled to each next count through its control endpoint (as `tidal scale
rollout=N` does) after ``phase_s`` seconds.

With ``--kind env`` the env actors are what bounds it: one rollout actor takes up to 256 requests a batch (still
``latency_s`` each), and each env actor hosts only 4 live episodes (as if each held a few sandboxes), so the
episodes in flight, and with them episodes/s, grow with the env actors; the run is scaled as `tidal scale env=N`
does. Each phase's episodes/s is measured from the run's totals, from
``settle_s`` after the joining actors took work to the next scale request, so the counts are compared within one
run, side by side, on the same machine load. Ends with:

    scaling episodes_per_s=<count>:<rate> ... ratio_<count>=<rate / the first count's> ...

`--quick` (about two minutes): phases of 25 s.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time

from actors.cli import load_config
from actors.runs.control import send_scale
from actors.observe.monitor import episodes_per_s
from actors.runs.driver import Driver

SETTLE_S = 3.0  # after the env actors started sending to the joining actors: their queues fill


def config(out: str, kind: str, latency_s: float, max_batch: int, first: int, minutes: float,
           overrides: list[str]) -> dict:
    """The scaling job: env actors with enough episodes in flight to keep 4 rollout actors' batches full (or, for
    ``kind`` env, 4 live episodes an env actor and one rollout actor that takes them all), a learner batch small
    enough that the learner keeps up (admission would otherwise bound episodes/s)."""
    actors = ([f"rollout.count={first}", "env.count=2", "env.args.concurrency=16",
               f"rollout.args.max_batch={max_batch}"] if kind == "rollout" else
              ["rollout.count=1", f"env.count={first}", "env.args.concurrency=4", "rollout.args.max_batch=256"])
    return load_config([f"run.dir={out}", f"run.name=scaling-{kind}-{int(time.time())}", "run.progress=false",
                        f"run.minutes={minutes}", "run.log_every_s=1", "eval.every_s=0",
                        "eval.endpoint_games_per_seat=4", "sampling.max_new_tokens=4", "replay.args.batch_episodes=8",
                        "replay.args.capacity_episodes=32", f"rollout.args.latency_s={latency_s}", *actors,
                        *overrides])


def drive(run: Driver, kind: str, counts: list[int], phase_s: float, runner: threading.Thread) -> None:
    """Scale ``run`` through its control endpoint to each next count, ``phase_s`` after the last took work."""
    while (run.started is None or not (run.dir / "control.json").exists()) and runner.is_alive():
        time.sleep(0.1)
    if not runner.is_alive():
        return
    since = run.started
    for count in counts[1:]:
        while time.time() < since + phase_s and runner.is_alive():
            time.sleep(0.1)
        if not runner.is_alive():
            return
        answer = send_scale(run.dir, kind, count)
        assert answer.ok, answer.message
        while "applied" not in (run.scaler.events[-1] if run.scaler.events else {}) and runner.is_alive():
            time.sleep(0.1)  # the joining actors are starting (loading a model takes seconds)
        since = run.scaler.events[-1].get("applied", time.time())


def phase_rates(rows: list[dict], started: float, events: list[dict], counts: list[int]) -> list[float | None]:
    """Episodes/s of each phase: from ``SETTLE_S`` after its actors took work to the next scale request."""
    starts = [started] + [e["applied"] for e in events]
    ends = [e["time"] for e in events] + [rows[-1]["time"]]
    return [episodes_per_s(rows, start + SETTLE_S, end) for start, end in zip(starts[:len(counts)], ends)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--kind", choices=["rollout", "env"], default="rollout", help="the actors to scale")
    parser.add_argument("--latency-s", type=float, default=0.25)
    parser.add_argument("--max-batch", type=int, default=2)
    parser.add_argument("--counts", default="1,2,4")
    parser.add_argument("--phase-s", type=float, default=45.0)
    parser.add_argument("--out", default="runs/scaling")
    args, overrides = parser.parse_known_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    counts = [int(c) for c in args.counts.split(",")]
    phase_s = 25.0 if args.quick else args.phase_s
    # each phase, plus a margin for the joining actors' start (a minute at most, on a busy machine)
    minutes = (len(counts) * phase_s + 60 * (len(counts) - 1)) / 60
    run = Driver(config(args.out, args.kind, args.latency_s, args.max_batch, counts[0], minutes, overrides))
    outcome = {}
    runner = threading.Thread(target=lambda: outcome.setdefault("summary", run.execute()))
    runner.start()
    try:
        drive(run, args.kind, counts, phase_s, runner)
        # the last phase runs phase_s too; the run's budget ends it
    finally:
        runner.join()
    summary = outcome["summary"]
    rows = [json.loads(line) for line in (run.dir / "metrics.jsonl").read_text().splitlines()]
    rates = phase_rates(rows, run.started, summary["scale_events"], counts)
    if args.kind == "rollout":
        print(f"latency-bound task: {args.latency_s} s a batch of at most {args.max_batch} requests per rollout actor")
    else:
        print(f"latency-bound task: {args.latency_s} s a batch, 4 live episodes per env actor")
    print(f"{args.kind + ' actors':>14}  episodes/s  vs the first")
    for count, rate in zip(counts, rates):
        ratio = rate / rates[0] if rate and rates[0] else float("nan")
        print(f"{count:>14}  {rate or float('nan'):>10.2f}  {ratio:>12.2f}")
    (run.dir / "scaling.json").write_text(json.dumps({"counts": counts, "episodes_per_s": rates,
                                                      "summary": summary}, indent=2))
    shown = " ".join(f"{c}:{r:.2f}" if r else f"{c}:nan" for c, r in zip(counts, rates))
    ratios = " ".join(f"ratio_{c}={r / rates[0]:.2f}" if r and rates[0] else f"ratio_{c}=nan"
                      for c, r in zip(counts[1:], rates[1:]))
    print(f"scaling episodes_per_s={shown} {ratios}")
    return 0 if all(rates) else 1


if __name__ == "__main__":
    sys.exit(main())
