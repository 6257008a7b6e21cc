"""`tidal replay`'s refusals: each names what is missing or wrong, exits 2, and writes nothing into the run."""

import json

import pytest

from actors.cli import main


@pytest.fixture
def bare_run(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"run": {"name": "run"}}))
    return run


def refused(capsys, *args) -> str:
    assert main(["replay", *map(str, args)]) == 2
    return capsys.readouterr().err


def test_a_run_without_the_episode_dataset_is_refused(bare_run, capsys):
    assert "observe.dataset=false" in refused(capsys, bare_run)
    assert sorted(p.name for p in bare_run.iterdir()) == ["config.json"]


def test_a_dataset_without_a_ledger_is_refused(bare_run, capsys):
    (bare_run / "episodes" / "20261128-000000" / "main").mkdir(parents=True)
    assert "no learner ledger" in refused(capsys, bare_run)


def test_a_ledger_that_does_not_parse_is_refused_naming_its_line(bare_run, capsys):
    (bare_run / "episodes" / "ledger").mkdir(parents=True)
    (bare_run / "episodes" / "ledger" / "main.jsonl").write_text('{"kind": "start"}\nnot json\n')
    assert "main.jsonl:1: version None is not a whole number" in refused(capsys, bare_run)


def test_not_a_run_directory(tmp_path, capsys):
    assert "not a run directory" in refused(capsys, tmp_path)


@pytest.mark.parametrize("args, said", [
    (["run.minutes=3"], "replay takes learner.* overrides"),
    (["reward.args.scorer=judge"], "not reward.args.scorer=judge"),  # a scorer only with --rescore
    (["reward=judge"], "not reward=judge"),
    (["--rescore", "reward=nope"], "reward=nope: no such config (configs/reward/ has game_outcome, judge)"),
    (["learner.args.lr=1e-3", "--eval", "ten"], "--eval 'ten': expected versions"),
])
def test_bad_arguments_are_named(bare_run, capsys, args, said):
    assert said in refused(capsys, bare_run, *args)
