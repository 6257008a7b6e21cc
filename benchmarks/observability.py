"""What seeing a run costs, and whether what it keeps is whole: TensorBoard and the episode dataset on vs off.

    python benchmarks/observability.py [--quick] [--pairs 3] [--minutes 1.5] [--out runs/observability] [overrides]

The default job (`tidal launch`, an embedded Ray cluster), ``pairs`` times with ``observe.tensorboard`` and
``observe.dataset`` on and once with both off, taking turns (the order flips every pair, so a drift of the
machine's load falls on both alike); each run trains ``minutes``. A run's episodes/s is measured from its
metrics rows, from ``WARMUP_S`` into training to its budget. Then the "on" runs' event files are read back with
TensorBoard's own reader (``EventAccumulator``) and their datasets with DuckDB, against the episodes the learner
trained (its final checkpoint's count). The endpoint evaluations are shortened (50 games a seat): they come
before and after training and do not enter the rate. Ends with:

    overhead=<1 - episodes/s on / off> tb_tags=<distinct tags read back> parquet_episodes=<distinct episode ids>
    trained_episodes=<episodes the learner trained> parquet_match=<1: equal, and no id in two batches; else 0>

(tb_tags: the fewest any "on" run gave back; the episode counts: summed over the "on" runs.) Before it, each
"on" run's CPU time in the dataset's thread and the TensorBoard writes, as a share of one core: a measure of the
cost that the machine's load does not blur. `--quick`: one pair of one-minute runs (about five minutes).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

WARMUP_S = 15.0  # of training, before the rate is measured


def launch(out: Path, name: str, on: bool, minutes: float, overrides: list[str]) -> Path:
    flag = str(on).lower()
    args = [f"run.dir={out}", f"run.name={name}", f"run.minutes={minutes}", "run.progress=false",
            "eval.endpoint_games_per_seat=50", f"observe.tensorboard={flag}", f"observe.dataset={flag}", *overrides]
    done = subprocess.run([sys.executable, "-m", "actors.cli", "launch", *args], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"run {name} failed: {done.stderr[-3000:]}")
    return out / name


def episodes_per_s(run: Path, minutes: float) -> float:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    inside = [r for r in rows if WARMUP_S <= r["elapsed_s"] <= minutes * 60]
    return (inside[-1]["episodes"] - inside[0]["episodes"]) / (inside[-1]["time"] - inside[0]["time"])


def observe_cpu_share(run: Path) -> float:
    """The CPU time the dataset's thread and the TensorBoard writes took, as a share of one core over the run's
    training (their own measurement: it does not move with the machine's load as episodes/s does)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    last = rows[-1]
    return ((last.get("dataset_cpu_s") or 0.0) + (last.get("tensorboard_cpu_s") or 0.0)) / max(last["elapsed_s"], 1e-9)


def tensorboard_tags(run: Path) -> int:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0, "histograms": 0})
    events.Reload()
    tags = events.Tags()
    return len(set(tags["scalars"]) | set(tags["histograms"]))


def dataset_accounts(run: Path) -> tuple[int, int, int]:
    """DuckDB on the run's dataset: distinct episode ids, ids found in more than one batch; and the episodes its
    learner trained (the final checkpoint's count)."""
    import duckdb
    import torch

    files = f"{run}/episodes/*/*/*.parquet"
    episodes = duckdb.sql(f"select count(distinct episode_id) from read_parquet('{files}')").fetchall()[0][0]
    twice = duckdb.sql(f"select count(*) from (select episode_id from read_parquet('{files}') group by member, "
                       f"episode_id having count(distinct (life, batch_seq)) > 1)").fetchall()[0][0]
    trained = torch.load(run / "policy" / "trainer_state.pt", weights_only=True)["totals"]["episodes"]
    return episodes, twice, trained


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one pair of one-minute runs")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--minutes", type=float, default=1.0, help="training budget of each run")
    parser.add_argument("--out", default="runs/observability")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run")
    args = parser.parse_args()
    pairs, minutes = (1, 1.0) if args.quick else (args.pairs, args.minutes)
    out = Path(args.out) / time.strftime("%Y%m%d-%H%M%S")
    rates = {True: [], False: []}
    on_runs = []
    print(f"{'pair':>4} {'observe':>7} {'episodes/s':>10}", flush=True)
    for pair in range(pairs):
        for on in ((True, False) if pair % 2 == 0 else (False, True)):
            run = launch(out, f"{pair}-{'on' if on else 'off'}", on, minutes, args.overrides)
            rates[on].append(episodes_per_s(run, minutes))
            print(f"{pair:>4} {'on' if on else 'off':>7} {rates[on][-1]:>10.2f}", flush=True)
            if on:
                on_runs.append(run)
    mean_on, mean_off = (sum(rates[k]) / len(rates[k]) for k in (True, False))
    print(f"mean episodes/s: on {mean_on:.2f}  off {mean_off:.2f}  on/off {mean_on / mean_off:.3f}")
    shares = [observe_cpu_share(run) for run in on_runs]
    print(f"observe_cpu_share (dataset thread + TensorBoard writes, of one core): "
          f"{' '.join(f'{x:.4f}' for x in shares)}")
    accounts = [dataset_accounts(run) for run in on_runs]
    episodes, twice, trained = (sum(a[i] for a in accounts) for i in range(3))
    match = int(twice == 0 and all(a[0] == a[2] for a in accounts))
    print(f"overhead={1 - mean_on / mean_off:.3f} tb_tags={min(tensorboard_tags(r) for r in on_runs)} "
          f"parquet_episodes={episodes} trained_episodes={trained} parquet_match={match}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
