"""A resume reads a run directory as data (review new 6 b): the settings that reach outside the run come only
from the command line, and ids that name directories are names."""

import dataclasses
import json

import pytest
import torch

from actors.cli import load_config
from actors.models.checkpoint_dir import TRAINER_STATE
from actors.observe.export import export_run


def written_run(tmp_path, overrides=(), name="launch"):
    """A run directory with the config.json of ``overrides`` and a checkpoint to resume from."""
    cfg = load_config([f"run.dir={tmp_path}", "run.name=r", *overrides], name)
    run = tmp_path / "r"
    for member in cfg.members():
        policy = run / ("policy" if cfg.league is None else f"members/{member.id}/policy")
        policy.mkdir(parents=True)
        torch.save({"cursor": {"life": "a", "seq": 0}}, policy / TRAINER_STATE)
    (run / "config.json").write_text(json.dumps(dataclasses.asdict(cfg)))
    return run


def test_a_resume_takes_the_cluster_model_and_services_only_from_its_command_line(tmp_path):
    run = written_run(tmp_path, ["model.path=/elsewhere/model"])
    saved = json.loads((run / "config.json").read_text())
    saved["ray"].update(address="10.0.0.66:6379", curve_dir="/tmp/keys")
    saved["observe"].update(wandb=True, wandb_mode="online")
    (run / "config.json").write_text(json.dumps(saved))
    with pytest.raises(ValueError) as refused:
        load_config([f"resume={run}", "run.minutes=1"])
    message = str(refused.value)
    for key in ("ray.address", "ray.curve_dir", "model.path", "observe.wandb", "observe.wandb_mode"):
        assert key in message
    assert "observe.wandb_project" not in message  # at its default: nothing to refuse
    assert "ray.address=10.0.0.66:6379" in message and "observe.wandb=true" in message  # the command to trust them
    cfg = load_config([f"resume={run}", "ray.address=null", "ray.curve_dir=null", "model.path=/mine",
                       "observe.wandb=false", "observe.wandb_mode=offline"])
    assert cfg.ray.address is None and cfg.model.path == "/mine" and not cfg.observe.wandb
    assert cfg.run.minutes == saved["run"]["minutes"]  # the run's own keys still come from its directory


def test_a_plain_runs_resume_needs_nothing_given_again(tmp_path):
    run = written_run(tmp_path)
    assert load_config([f"resume={run}"]).resume == str(run)


@pytest.mark.parametrize("bad", ["..", "a/b", "../../etc"])
def test_ids_that_name_directories_must_be_names(tmp_path, bad):
    with pytest.raises(ValueError, match=f"run.policy_id '{bad}' is not a name"):
        load_config([f"run.dir={tmp_path}", f"run.policy_id={bad}"])
    with pytest.raises(ValueError, match=f"league member id '{bad}' is not a name"):
        load_config([f"run.dir={tmp_path}", f"league.members=[{{id: main, role: main}}, {{id: '{bad}'}}]"],
                    "league")
    run = written_run(tmp_path)  # a config.json edited after the run: the export refuses it too
    saved = json.loads((run / "config.json").read_text())
    saved["run"]["policy_id"] = bad
    (run / "config.json").write_text(json.dumps(saved))
    with pytest.raises(ValueError, match="is not a name"):
        export_run(run)
    with pytest.raises(ValueError, match="is not a name"):
        load_config([f"resume={run}"])
