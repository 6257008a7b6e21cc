"""Seeing a run: its metrics rows as TensorBoard events (read back with TensorBoard's own reader), its trained
episodes as a Parquet dataset (queried with DuckDB), `tidal top` on a recorded run, and `tidal export` from a
spill."""

import json
import re
from types import SimpleNamespace

import duckdb
import pyarrow as pa
import pytest
import torch
from rich.console import Console
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from actors.cli import main
from actors.learner.dataset import EpisodeDataset
from actors.observe.export import export_run
from actors.observe.tensorboard import TensorBoardLog
from actors.runs.dashboard import render
from actors.observe.wandb_log import WandbLog, wandb_run_id
from actors.replay.spill import Spill
from tests import wandb_records
from tests.factories import versions_episode as episode


def batch(names: list[str], version: int) -> pa.Table:
    return pa.concat_tables([episode(name, [[version, version], [version]]) for name in names])


def per_life_and_version(root) -> list[tuple]:
    """DuckDB: distinct episodes per life, member and trained version; and every id trained more than once."""
    files = f"{root}/*/*/*.parquet"
    counts = duckdb.sql(f"select life, member, trained_version, count(distinct episode_id) from read_parquet('{files}')"
                        " group by all order by all").fetchall()
    twice = duckdb.sql(f"select episode_id from read_parquet('{files}') group by member, episode_id "
                       "having count(distinct (life, batch_seq)) > 1").fetchall()
    return counts, twice


def test_the_dataset_holds_each_trained_episode_once_across_a_restart_and_a_new_life(tmp_path):
    learner = SimpleNamespace(dataset_dir=str(tmp_path), data_life="life1", policy_id="main")
    first = EpisodeDataset.opened(learner, {}, decode=lambda ids: [str(i) for i in ids])
    for seq in (1, 2, 3):
        first.add(batch([f"life1/env-0-0-{2 * seq}", f"life1/env-0-0-{2 * seq + 1}"], seq - 1), seq, seq - 1)
    first.close()  # killed after batch 3; its checkpoint holds batch 2
    restarted = EpisodeDataset.opened(learner, {"life": "life1", "seq": 2})
    assert not (tmp_path / "life1" / "main" / "batch-00000003.parquet").exists()  # trained past the checkpoint
    restarted.add(batch(["life1/env-0-0-6", "life1/env-0-0-7"], 2), 3, 2)  # batch 3 again, then a 4th
    restarted.add(batch(["life1/env-0-0-8"], 3), 4, 3)
    restarted.close()
    # a resumed run (a new life) from a checkpoint that had consumed batch 3 of life1: batch 4 is trained again
    resumed = EpisodeDataset.opened(SimpleNamespace(dataset_dir=str(tmp_path), data_life="life2", policy_id="main"),
                                    {"life": "life1", "seq": 3})
    resumed.add(batch(["life1/env-0-0-8", "life2/env-0-0-0"], 4), 1, 4)
    resumed.close()
    counts, twice = per_life_and_version(tmp_path)
    assert counts == [("life1", "main", 0, 2), ("life1", "main", 1, 2), ("life1", "main", 2, 2),
                      ("life2", "main", 4, 2)]
    assert twice == []
    texts = duckdb.sql(f"select distinct prompt_text from read_parquet('{tmp_path}/life1/main/batch-00000001.parquet')")
    assert texts.fetchall() == [("[1]",)]  # the prompt, decoded


def test_a_dataset_write_that_fails_turns_the_dataset_off_and_training_goes_on(tmp_path, monkeypatch, caplog):
    """Review new 9: a full disk under the dataset (an observer) no longer ends the learner."""
    import errno

    import actors.learner.dataset as dataset_module

    dataset = EpisodeDataset(tmp_path, "life1", "main")
    dataset.add(batch(["a"], 0), 1, 0)
    dataset.flush()
    real = dataset_module.pq.write_table

    def full(table, where, **kwargs):
        open(where, "wb").write(b"PAR1 cut")  # a write cut short: its .partial is left
        raise OSError(errno.ENOSPC, "No space left on device", str(where))

    monkeypatch.setattr(dataset_module.pq, "write_table", full)
    dataset.add(batch(["b"], 1), 2, 1)  # the learner's next batch: neither add nor flush raises
    dataset.flush()
    monkeypatch.setattr(dataset_module.pq, "write_table", real)
    dataset.add(batch(["c"], 2), 3, 2)  # the disk has room again: the dataset stays off (it would have a gap)
    dataset.close()
    assert dataset.off and dataset.written["failed"] == 1 and dataset.written["batches"] == 1
    assert "the dataset is turned off" in caplog.text and "training goes on" in caplog.text
    files = sorted(p.name for p in (tmp_path / "life1" / "main").iterdir())
    assert files == ["batch-00000001.parquet", "batch-00000002.parquet.partial"]
    learner = SimpleNamespace(dataset_dir=str(tmp_path), data_life="life1", policy_id="main")
    EpisodeDataset.opened(learner, {"life": "life1", "seq": 2}).close()  # the next start removes the cut write
    assert sorted(p.name for p in (tmp_path / "life1" / "main").iterdir()) == ["batch-00000001.parquet"]


def rows(n: int = 4) -> list[dict]:
    out = []
    for k in range(n):
        out.append({"time": 1000.0 + 5 * k, "elapsed_s": 5.0 * k, "version": 10 * k, "episodes": 100 * k,
                    "episodes_per_s": 20.0 + k, "tokens_per_s": 300.0, "learner_busy": 0.6, "rollout_idle": 0.1,
                    "queue_requests": 3, "queue_replay": 7, "rollout_actors": 2, "env_actors": 1, "restarts": 1,
                    "restarts_by_actor": {"rollout-1": 1}, "scale_events": 1, "trained_episodes": 90 * k,
                    "staleness_mean": 1.25, "staleness_max": 2, "staleness_hist": {"0": 5, "2": 3},
                    "staleness_total": {"0": 50, "1": 30, "2": 20}, "is_weight_hist": {"0.7071": 4, "1": 90, "2": 6},
                    "pg_loss": -0.1, "lr": 2.5e-4, "eta": 2,
                    "train_return": 0.3, "invalid_rate": 0.02, "ratings": {"main": 3.5, "exploiter": 1.25},
                    "versions": {"main": 10 * k}, "matches": 40 * k})
    out[-1]["evaluation"] = {"tag": "during-1", "minute": 0.25, "player": "main", "opponent": "random",
                             "nonloss": 0.8125, "nonloss_by_seat": {"0": 0.75, "1": 0.875}, "win_rate": 0.5,
                             "invalid_rate": 0.0}
    return out


def test_every_metric_of_a_row_reaches_tensorboard(tmp_path):
    board = TensorBoardLog(tmp_path)
    for row in rows():
        board.write(row)
    board.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0, "histograms": 0})
    events.Reload()
    scalars, histograms = set(events.Tags()["scalars"]), set(events.Tags()["histograms"])
    assert {"throughput/episodes_per_s", "system/learner_busy", "system/queue_replay", "faults/restarts",
            "faults/restarts_by_actor/rollout-1", "staleness/staleness_mean", "loss/lr", "train/train_return",
            "league/ratings/main", "league/ratings/exploiter", "eval/main_vs_random/nonloss",
            "eval/main_vs_random/seat1"} <= scalars
    assert histograms == {"staleness/batch_tokens", "staleness/all_tokens", "staleness/importance_weights"}
    assert board.tags == scalars | histograms
    assert [(e.step, e.value) for e in events.Scalars("throughput/episodes_per_s")] == [(0, 20), (5, 21), (10, 22),
                                                                                       (15, 23)]
    assert [(e.step, e.value) for e in events.Scalars("eval/main_vs_random/nonloss")] == [(15, 0.8125)]
    last = events.Histograms("staleness/all_tokens")[-1].histogram_value
    assert (last.num, last.min, last.max, list(last.bucket)) == (100, 0, 2, [50, 30, 20])
    weights = events.Histograms("staleness/importance_weights")[-1].histogram_value
    assert list(weights.bucket_limit) == pytest.approx([0.7071, 1, 2]) and list(weights.bucket) == [4, 90, 6]


def test_top_shows_a_recorded_runs_figures(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows()))
    (tmp_path / "summary.json").write_text("{}")
    console = Console(record=True, width=140)
    console.print(render(tmp_path))
    screen = console.export_text()
    assert "finished, 4 metrics rows" in screen
    for figure in ("policy version", "30", "episodes/s", "23.000", "learner busy", "0.600", "replay buffered",
                   "1.25 / 2", "during-1", "0.812", "0:0.75 1:0.88", "exploiter", "3.50", "scale events: 1", "50.0%"):
        assert figure in screen, figure
    assert re.search(r"│ rollout +│ 2 +│ 1 +│", screen)  # two rollout actors, one restart


def test_top_refuses_what_is_not_a_run(tmp_path, capsys):
    assert main(["top", "--once", str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().err


def test_export_writes_the_batches_the_checkpoint_consumed_from_the_spill(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"run": {"policy_id": "main"}}))
    spill = Spill(str(tmp_path / "replay" / "life1"))
    for seq in (1, 2, 3):
        names = [f"life1/env-0-0-{2 * seq}", f"life1/env-0-0-{2 * seq + 1}"]
        for name in names:
            spill.add_episode(episode(name, [[seq], [seq]]))
        spill.add_batch(seq, names)
    spill.close()
    (tmp_path / "policy").mkdir()
    torch.save({"cursor": {"life": "life1", "seq": 2}}, tmp_path / "policy" / "trainer_state.pt")
    counts = export_run(tmp_path)
    assert (counts["batches"], counts["episodes"], counts["compacted"]) == (2, 4, 0)
    found = duckdb.sql(f"select batch_seq, count(distinct episode_id), count(trained_version) from "
                       f"read_parquet('{tmp_path}/episodes/*/*/*.parquet') group by all order by all").fetchall()
    assert found == [(1, 2, 0), (2, 2, 0)]  # batch 3 was not checkpointed; the trained version is unknown
    with pytest.raises(FileExistsError, match="holds a dataset already"):
        export_run(tmp_path)


def test_the_same_figures_reach_weights_and_biases_offline(tmp_path):
    """The W&B writer is fed the rows the TensorBoard one is, and logs the same tags (read back from the offline
    run's own file), each row at its elapsed seconds, the histograms with their counts."""
    board, wandb_log = TensorBoardLog(tmp_path), WandbLog(tmp_path, {"run": {"name": "test"}})
    for row in rows():
        board.write(row)
        wandb_log.write(row)
    board.close()
    wandb_log.close()
    logged = wandb_records.history(tmp_path)
    tags = {key for entry in logged for key in entry} - {"elapsed_s", "_step", "_runtime", "_timestamp"}
    assert tags == board.tags == wandb_log.tags
    episodes = [(e["elapsed_s"], e["throughput/episodes_per_s"]) for e in logged if "throughput/episodes_per_s" in e]
    assert episodes == [(0, 20), (5, 21), (10, 22), (15, 23)]
    assert [(e["elapsed_s"], e["eval/main_vs_random/nonloss"]) for e in logged
            if "eval/main_vs_random/nonloss" in e] == [(15, 0.8125)]
    staleness = logged[-2]["staleness/all_tokens"]  # the last row's (the evaluation came after it)
    assert staleness["_type"] == "histogram" and staleness["values"] == [50, 30, 20]
    assert staleness["bins"] == [-0.5, 0.5, 1.5, 2.5]
    batch = logged[-2]["staleness/batch_tokens"]  # values 0 and 2: the missing 1 counts zero
    assert batch["values"] == [5, 0, 3]
    weights = logged[-2]["staleness/importance_weights"]
    assert weights["values"] == [4, 90, 6] and weights["bins"] == pytest.approx([0.5, 0.7071, 1, 2], rel=1e-3)


def test_a_resumed_run_goes_on_in_the_same_wandb_run(tmp_path):
    first = WandbLog(tmp_path, {})
    first.write(rows()[0])
    first.close()
    again = WandbLog(tmp_path, {})
    again.write(rows()[1])
    again.close()
    assert first.run.id == again.run.id == wandb_run_id(tmp_path) != wandb_run_id(tmp_path / "other")
    assert [e["elapsed_s"] for e in wandb_records.history(tmp_path)] == [0, 5]


def test_wandb_settings_are_checked_before_a_run_starts(tmp_path):
    from actors.cli import load_config

    with pytest.raises(ValueError, match="observe.wandb_mode must be one of offline, online, not 'cloud'"):
        load_config([f"run.dir={tmp_path}", "observe.wandb_mode=cloud"])
