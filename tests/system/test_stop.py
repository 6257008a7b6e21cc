"""`tidal stop` ends a real run through its control endpoint: metrics, checkpoint and summary written, as on
Ctrl-C, and nothing of it left in shared memory."""

import json
import os

import torch

from actors.cli import main
from actors.models.checkpoint_dir import TRAINER_STATE
from actors.runs.control import CONTROL_FILE
from streams.private_files import SHM_DIR, _owner_prefix
from tests.factories import wait_for
from tests.factories import BackgroundRun, small_config


def test_tidal_stop_ends_a_run_cleanly_with_its_summary_and_checkpoint(tiny_model_dir, tmp_path):
    cfg = small_config(tmp_path, **{"model.path": tiny_model_dir, "run.mode": "local", "run.minutes": 5,
                                    "run.log_every_s": 0.5})
    background = BackgroundRun(cfg)
    run = background.run
    mine = f"{_owner_prefix()}{os.getpid()}-"  # in one process, the learner's weights directory is this process's

    def ours() -> set[str]:
        return {name for name in os.listdir(SHM_DIR) if name.startswith(mine)}

    before = ours()
    try:
        wait_for(lambda: background.last_row({"version": 0})["version"] >= 1, "training", timeout=240)
        assert ours() - before  # the learner's weights, while it runs
        assert main(["stop", "--run", str(run.dir), "--now"]) == 0
    finally:
        summary = background.join(timeout=240)
    assert summary is not None, "the run did not end after tidal stop"
    written = json.loads((run.dir / "summary.json").read_text())
    assert written["stopped"] and not written["interrupted"] and written["minutes"] < 4
    assert written["start_nonloss"] is not None and written["final_nonloss"] is None  # --now: no final evaluation
    assert written["final_version"] >= 1 and (run.dir / "metrics.jsonl").read_text()
    state = torch.load(run.dir / "policy" / TRAINER_STATE, weights_only=True)  # the checkpoint at the stop
    assert state["version"] >= written["final_version"]
    assert not (run.dir / CONTROL_FILE).exists()
    assert ours() <= before
