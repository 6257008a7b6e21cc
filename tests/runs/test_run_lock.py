"""One driver per run directory (review new 12): a resume or an export of a run whose driver holds its lock is
refused, naming the run, and nothing of the run is touched."""

import torch

from actors.cli import load_config, main
from actors.models.checkpoint_dir import TRAINER_STATE
from actors.runs.driver import Driver
from actors.runs.run_lock import LOCK, RunLock


def test_a_running_runs_directory_refuses_a_resume_and_an_export(tmp_path, capsys):
    run = Driver(load_config([f"run.dir={tmp_path}", "run.name=x", "observe.tensorboard=false"]))
    run_dir = tmp_path / "x"
    (run_dir / "policy").mkdir()
    torch.save({"cursor": {"life": "a", "seq": 0}}, run_dir / "policy" / TRAINER_STATE)  # resumable, were it free
    saved = (run_dir / "config.json").read_text()
    capsys.readouterr()

    assert main(["launch", f"resume={run_dir}", "observe.tensorboard=false"]) == 2
    error = capsys.readouterr().err
    assert f"{run_dir} is in use" in error and "pid" in error and "tidal stop --run" in error
    assert (run_dir / "config.json").read_text() == saved  # the second driver wrote nothing
    assert main(["export", str(run_dir)]) == 2
    assert f"{run_dir} is in use" in capsys.readouterr().err
    assert not (run_dir / "episodes").exists()

    run.lock.release()  # the run ended
    with RunLock(run_dir, "a test") as lock:
        assert "a test" in lock.path.read_text() and lock.path.name == LOCK
