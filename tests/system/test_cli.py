"""The real entry point: `tidal launch` on an embedded Ray cluster, with a tiny budget."""

import json
import subprocess
import sys

import pytest

from rich.console import Console

from actors.cli import main
from actors.runs.dashboard import render
from tests import wandb_records
from tests.factories import dataset_accounts

pytestmark = pytest.mark.ray


def vllm_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


@pytest.mark.parametrize("backend", ["hf", pytest.param("vllm", marks=pytest.mark.skipif(
    not vllm_installed(), reason="the vllm extra is not installed (docs/backends.md)"))])
def test_tidal_launch_end_to_end(backend, tiny_model_dir, tmp_path):
    args = [f"model.path={tiny_model_dir}", f"run.dir={tmp_path}", "run.name=smoke", "run.minutes=0.5",
            "run.max_versions=3", "run.log_every_s=1", "replay.args.batch_episodes=8",
            "replay.args.capacity_episodes=16", "env.args.concurrency=8", "eval.games_per_seat=4",
            "eval.endpoint_games_per_seat=4", "eval.every_s=5", "sampling.max_new_tokens=4", "ray.num_cpus=2",
            f"rollout.backend={backend}"]
    if backend == "vllm":  # synchronous: every trained token comes from the learner's weights of the moment
        args.append("learner.max_staleness=0")
    else:  # the adaptive bound, between 0 and 3; and the figures to Weights & Biases too, offline
        args += ["learner.max_staleness=auto", "learner.args.staleness.max=3", "observe.wandb=true"]
    run = tmp_path / "smoke"
    with open(tmp_path / "out.txt", "w") as stdout, open(tmp_path / "err.txt", "w") as stderr:  # no pipe to fill
        process = subprocess.Popen([sys.executable, "-m", "actors.cli", "launch", *args], stdout=stdout,
                                   stderr=stderr, text=True)
        screen = top_while_running(process, run)
        process.wait(timeout=560)
    out, err = (tmp_path / "out.txt").read_text(), (tmp_path / "err.txt").read_text()
    assert process.returncode == 0, err[-3000:]
    assert "non-loss vs random: start" in out
    # `tidal top` against the live run: its figures as the run had them
    assert "(running," in screen and "policy version" in screen and "start" in screen, screen
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_version"] >= 3 and not summary["interrupted"]
    assert 0 <= summary["start_nonloss"] <= 1 and 0 <= summary["final_nonloss"] <= 1
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("staleness_mean" in r for r in rows) and any(r.get("episodes_per_s", 0) > 0 for r in rows)
    # the staleness and utilisation metrics of the asynchronous learner
    trained = [r for r in rows if "staleness_hist" in r]
    assert trained and all(max(map(int, r["staleness_hist"])) <= (0 if backend == "vllm" else 3) for r in trained)
    assert all(0 <= r["eta"] <= 3 for r in trained)
    # the importance weights' ESS of every batch that trained a token (a batch whose rows all had a negligible
    # advantage trains none, and has none)
    assert all(0 < r["is_ess"] <= 1 if r["is_ess"] is not None else r["rows_trained"] == 0 for r in trained)
    assert any(r["is_ess"] is not None for r in trained)
    # the guard's count, carried to the summary (the test model on batches of 8 can truly trip it: it once went
    # from 0.22 to 0.67 and 0.89 invalid moves in two batches, with vLLM)
    trips = [r["guard_trips"] for r in trained]
    assert trips == sorted(trips) and trips[-1] == summary["guard_trips"] >= 0
    assert all(key in trained[-1] for key in ("is_weight_mean", "is_outside_share", "learner_busy", "rollout_idle",
                                               "queue_requests", "queue_replay", "live_episodes", "rejected_episodes"))
    assert 0 < trained[-1]["learner_busy"] <= 1 and sum(summary["staleness_hist"].values()) > 0
    assert (run / "learning_curve.png").stat().st_size > 0
    assert (run / "policy" / "config.json").exists()  # the trained policy, loadable with from_pretrained
    # the learner's per-batch check of the engine: its log-probs of the tokens its current weights sampled
    same = [r["logprob_gap_same_version"] for r in trained if "logprob_gap_same_version" in r]
    assert all(gap <= 4e-4 for gap in same), same
    if backend == "vllm":  # with eta 0 every batch has them
        assert len(same) == len(trained)
    tensorboard_tags = check_tensorboard_and_dataset(run)
    if backend != "vllm":  # W&B's offline run holds the same figures, the last version among them
        logged = wandb_records.history(run)
        assert {k for e in logged for k in e} - {"elapsed_s", "_step", "_runtime", "_timestamp"} == tensorboard_tags
        assert [e["throughput/version"] for e in logged if "throughput/version" in e][-1] >= 3


def top_while_running(process, run) -> str:
    """`tidal top`'s screen of ``run`` once it has written metrics rows, while it still runs."""
    import time

    deadline = time.monotonic() + 400
    while not ((run / "control.json").exists() and len(read_lines(run / "metrics.jsonl")) >= 2):
        assert process.poll() is None and time.monotonic() < deadline, "the run ended or stalled before training"
        time.sleep(0.2)
    console = Console(record=True, width=140)
    console.print(render(run))
    return console.export_text()


def read_lines(path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def check_tensorboard_and_dataset(run) -> set[str]:
    """The run's TensorBoard events read back with TensorBoard's reader; its episode dataset with DuckDB: every
    episode the learner trained (its final checkpoint's count) exactly once. Returns the TensorBoard tags."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    tags = events.Tags()
    assert len(tags["scalars"]) >= 20 and "staleness/batch_tokens" in tags["histograms"], tags
    assert events.Scalars("throughput/version")[-1].value >= 3
    accounts = dataset_accounts(run)
    assert sum(accounts["per_life"].values()) == accounts["trained"] > 0 and accounts["twice"] == [], accounts
    return set(tags["scalars"]) | set(tags["histograms"])


def test_a_bad_override_fails_with_a_clear_message(capsys):
    assert main(["launch", "run.minutes=2", "no_such_group.key=1"]) == 2
    assert "no_such_group" in capsys.readouterr().err


def test_a_temperature_vllm_refuses_fails_before_anything_starts(capsys):
    assert main(["launch", "rollout.backend=vllm", "sampling.temperature=3"]) == 2
    assert "sampling.temperature=3" in capsys.readouterr().err


def test_ctrl_c_stops_the_run_and_keeps_its_metrics_and_plot(tiny_model_dir, tmp_path):
    import signal
    import time

    args = [f"model.path={tiny_model_dir}", f"run.dir={tmp_path}", "run.name=interrupted", "run.mode=local",
            "run.minutes=5", "run.log_every_s=0.5", "replay.args.batch_episodes=8", "env.args.concurrency=8",
            "eval.games_per_seat=4", "eval.endpoint_games_per_seat=4", "eval.every_s=0", "sampling.max_new_tokens=4"]
    # a child inherits an ignored SIGINT (pytest started as a background job of a script), and Python then
    # leaves it ignored: the Ctrl-C under test would do nothing. Handled here, the child starts with the default.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        process = subprocess.Popen([sys.executable, "-m", "actors.cli", "launch", *args], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    metrics = tmp_path / "interrupted" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):  # training has begun
        assert process.poll() is None and time.monotonic() < deadline, "the run ended or stalled before training"
        time.sleep(0.1)
    process.send_signal(signal.SIGINT)
    try:
        out, err = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:  # say where it hangs (the CLI dumps every thread's stack on SIGUSR1)
        process.send_signal(signal.SIGUSR1)
        try:
            process.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"SIGINT did not stop the run within 120 s; its threads then:\n{err[-8000:]}")
    assert process.returncode == 130, err[-2000:]
    summary = json.loads((tmp_path / "interrupted" / "summary.json").read_text())
    assert summary["interrupted"] and summary["start_nonloss"] is not None and summary["final_nonloss"] is None
    assert (tmp_path / "interrupted" / "learning_curve.png").exists()
    assert "non-loss vs random: start" in out


def test_tidal_envs_lists_every_environment_and_opponent(capsys):
    from envs.registry import ENVIRONMENTS, OPPONENTS

    assert main(["envs"]) == 0
    out = capsys.readouterr().out
    listed = {line.split()[0] for line in out.splitlines()[1:] if line.strip() and not line.startswith("opponents")}
    assert set(ENVIRONMENTS) | {"gem:<id>"} == listed
    assert all(name in out.splitlines()[-1] for name in OPPONENTS)
    assert "liars_dice         2-6" in out
