"""benchmarks/chaos.py --quick: a kill and a crash of every kind (the learner's kill between two checkpoints), the
learner and replay killed together, a hung actor, dropped episodes, rollouts 1 -> 4 -> 2 and envs 2 -> 3 -> 2 in
about three minutes of training."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_chaos_quick_loses_nothing_and_counts_nothing_twice(tmp_path):
    done = subprocess.run([sys.executable, str(BENCHMARKS / "chaos.py"), "--quick", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=880)
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    match = re.fullmatch(r"kills=(\d+) crashes=(\d+) lost=(\d+) duplicated=(\d+) recover_s=([\d.]+|inf|nan) "
                         r"scale_events=(\d+) staleness_max=(-?\d+) pair_kills=(\d+) hangs=(\d+) drops=(\d+) "
                         r"stalled_s=([\d.]+)", last)
    assert match, last
    kills, crashes, lost, duplicated, _, scale_events, staleness_max, pairs, hangs, drops, stalled = match.groups()
    assert (int(kills), int(lost), int(duplicated), int(scale_events)) == (5, 0, 0, 4) and int(crashes) >= 4, last
    assert int(staleness_max) <= 2, last  # learner.max_staleness
    assert int(pairs) >= 1 and int(hangs) >= 1 and int(drops) >= 1 and float(stalled) < 60, last
