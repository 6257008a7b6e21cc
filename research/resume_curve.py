"""A run killed with SIGKILL halfway and resumed: does its learning curve go on from where it was?

    python research/resume_curve.py [--minutes 8] [--kill-after 4] [--out runs/resume] [overrides...]

Starts the default job (`tidal launch`, embedded Ray) in a session of its own, lets it train ``--kill-after``
minutes (past an evaluation during training), then kills every process of that session with SIGKILL: no clean
stop, no final checkpoint, no summary. Then `tidal launch resume=<run dir>` continues it to its whole budget.
Prints the run's evaluations across both lives (minute, policy version, non-loss against random) and ends with:

    killed_at_version=<v> resumed_at_version=<v> nonloss_before_kill=<x> nonloss_at_resume=<x> final_nonloss=<x>

``resumed_at_version`` is the last checkpoint's (every `learner.checkpoint_every` versions: what came after it is
trained again); ``nonloss_before_kill`` the last evaluation of the first life, ``nonloss_at_resume`` that of the
checkpointed policy when the second life starts.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def session_processes(sid: int) -> list[int]:
    """Every process still in session ``sid`` (Ray's processes started by the killed driver, say)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":  # after the name: state, ppid, pgrp, session
            pids.append(int(stat.parent.name))  # (a zombie is dead, waiting for its parent to reap it)
    return pids


def kill_session(sid: int) -> None:
    for _ in range(50):
        pids = session_processes(sid)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
    raise RuntimeError(f"processes of the killed run's session {sid} would not die: {session_processes(sid)}")


def rows(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=8.0)
    parser.add_argument("--kill-after", type=float, default=4.0, help="minutes of training before the kill")
    parser.add_argument("--out", default="runs/resume")
    args, overrides = parser.parse_known_args()
    name = f"resume-{int(time.time())}"
    run = Path(args.out) / name
    tidal = [sys.executable, "-m", "actors.cli", "launch"]
    first = subprocess.Popen([*tidal, f"run.dir={args.out}", f"run.name={name}", f"run.minutes={args.minutes}",
                              "run.progress=false", *overrides], start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kill_after_s, deadline = args.kill_after * 60, time.monotonic() + args.kill_after * 60 + 900
    while not (during := [r for r in rows(run) if r.get("evaluation", {}).get("tag", "").startswith("during")]) \
            or during[-1]["elapsed_s"] < kill_after_s:
        if first.poll() is not None or time.monotonic() > deadline:
            print(f"the first life ended or stalled before {args.kill_after} minutes of training", file=sys.stderr)
            return 1
        time.sleep(1.0)
    killed_at = rows(run)[-1]["version"]
    kill_session(first.pid)  # the driver, its embedded Ray and every actor: nothing stops cleanly
    first.wait()
    print(f"killed the run at version {killed_at}, {during[-1]['elapsed_s'] / 60:.1f} min into training", flush=True)
    assert not (run / "summary.json").exists()
    second = subprocess.run([*tidal, f"resume={run}", "run.progress=false", *overrides],  # (model.path: only so) stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    if second.returncode != 0:
        print(second.stderr[-3000:], file=sys.stderr)
        return 1
    evaluations = json.loads((run / "summary.json").read_text())["evaluations"]
    print(f"{'evaluation':>12} {'minute':>7} {'version':>8} {'non-loss':>9}")
    for e in evaluations:
        print(f"{e['tag']:>12} {e['minute']:7.1f} {e.get('version_min', '-'):>8} {e['nonloss']:9.3f}")
    tags = [e["tag"] for e in evaluations]
    resume = evaluations[tags.index("resume")]
    before = evaluations[tags.index("resume") - 1]
    print(f"killed_at_version={killed_at} resumed_at_version={resume.get('version_min')} "
          f"nonloss_before_kill={before['nonloss']:.3f} nonloss_at_resume={resume['nonloss']:.3f} "
          f"final_nonloss={evaluations[-1]['nonloss']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
