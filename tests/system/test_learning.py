"""The learning claim of the default job, measured end to end (about ten minutes: `pytest -m slow`)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "learn_tictactoe.py"


def test_default_job_learns_tictactoe_against_random(tmp_path):
    done = subprocess.run([sys.executable, str(BENCHMARK), f"run.dir={tmp_path}", "run.progress=false"],
                          capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    match = re.fullmatch(r"start_nonloss=([\d.]+) final_nonloss=([\d.]+) minutes=([\d.]+)", last)
    assert match, last
    start, final, minutes = map(float, match.groups())
    assert final >= 0.80 and final - start >= 0.20 and minutes <= 10.5, last
