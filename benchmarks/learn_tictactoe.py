"""The default job, measured: does mirror self-play make the tiny model better against a random opponent?

    python benchmarks/learn_tictactoe.py [hydra overrides...]

Runs `tidal launch` with the default config (an embedded Ray cluster, mirror self-play TicTacToe) and ends
with one line:

    start_nonloss=<0..1> final_nonloss=<0..1> minutes=<m>

non-loss against the random-legal opponent, averaged over both seats, of the base model (before any update)
and of the trained policy; minutes is the job's wall time (Ray start, evaluations and training). Making the
tiny base model is a one-time step, cached in ~/.cache/tidal/models, and timed on a line of its own.
"""

from __future__ import annotations

import logging
import sys
import time

from actors.models.base_model import ensure_base_model, tiny_model_config
from actors.cli import load_config
from actors.cli import launch


def main(overrides: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    cfg = load_config(overrides)
    if not cfg.model.path:
        started = time.time()
        ensure_base_model(cfg.model.cache_dir, tiny_model_config(cfg))
        print(f"base_model_minutes={(time.time() - started) / 60:.2f} (one-time, cached)", flush=True)
    started = time.time()
    summary = launch(cfg)
    minutes = (time.time() - started) / 60
    if summary["final_nonloss"] is None:
        print(f"the run ended without a final evaluation (interrupted={summary['interrupted']})", file=sys.stderr)
        return 1
    print(f"start_nonloss={summary['start_nonloss']:.3f} final_nonloss={summary['final_nonloss']:.3f} "
          f"minutes={minutes:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
