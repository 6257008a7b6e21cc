"""``tidal replay`` on a learner recorded in this process: every version bitwise again (a guard rollback and a
learner restart included), a planted divergence found at its version, a missing batch refused with the version it
stops at, the ledger exactly once across a restart, a counterfactual beside the faithful replay, a reward audit."""

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from actors.learner.actor import LearnerActor, LearnerConfig
from actors.learner.dataset import EpisodeDataset, batch_file
from actors.learner.ledger import Ledger, LedgerError, ledger_path, read_ledger
from actors.learner.rerun import Recorded, ReplayRefused, Rerun, checkpoints_at
from actors.reward.actor import SCORERS, RewardConfig
from actors.reward.rescore import rescore
from streams.schema import Columns, trajectory_table
from tests.factories import sampled_row

LIFE = "20261128-000000"


def batch(version: int, n: int, invalid: bool = False, stale: int = 0):
    """Four episodes of two seats' one turn each, sampled by ``version`` (the first ``stale`` turns by a version
    long gone)."""
    sampled = SimpleNamespace(tokens=[7, 8, 9], logprobs=[-1.0, -1.2, -0.8])
    rows = []
    for i in range(8):
        r = sampled_row([5, 6, 11 + n % 5, 12], sampled, version=max(version - (9 if i < stale else 0), 0),
                        seat=i % 2, ret=-1.0 if invalid or (i + n) % 3 else 1.0, episode=f"b{n}-{i // 2}")
        r[Columns.INVALID_ACTION] = invalid
        rows.append(r)
    return trajectory_table(rows)


def config(tiny_model_dir, run: Path, **changes) -> LearnerConfig:
    return LearnerConfig(model_path=str(tiny_model_dir), max_staleness=2, lr=1e-3, data_life=LIFE,
                         dataset_dir=str(run / "episodes"), save_dir=str(run / "policy"),
                         guard={"patience": 2, "cooldown": 3, "anchor_every": 3, "ess_floor": 0.0}, **changes)


def start(cfg: LearnerConfig) -> LearnerActor:
    """A learner as its ``run`` starts one (from its checkpoint with ``cfg.resume``), recording."""
    learner = LearnerActor(cfg)
    checkpoint = learner._checkpoint()
    learner._load(checkpoint)
    learner.dataset = EpisodeDataset.opened(cfg, learner._checkpoint_cursor)
    learner.ledger = learner._open_ledger(checkpoint)
    learner._record(learner._start_entry(checkpoint))
    return learner


def feed(learner: LearnerActor, batches: list[tuple[int, bool, int]]) -> None:
    """Batches numbered on from the learner's cursor: (invalid, stale turns) each, as its loop consumes them."""
    for invalid, stale in batches:
        seq = learner.cursor + 1
        learner.cursor = seq
        learner._consume(batch(learner.version, seq, invalid, stale), seq)
    learner.dataset.flush()


HEALTHY, COLLAPSE = (False, 0), (True, 0)


@pytest.fixture(scope="module")
def recorded_run(tiny_model_dir, tmp_path_factory):
    """Twelve versions: a rollback (a forced collapse at 7-8), a batch wholly past the bound and one turn of the
    next, a checkpoint at 9, two updates lost to a kill, and a restart that trains their batches again."""
    run = tmp_path_factory.mktemp("run")
    (run / "config.json").write_text("{}")
    learner = start(config(tiny_model_dir, run))
    feed(learner, [HEALTHY] * 6 + [COLLAPSE, COLLAPSE, (False, 8), (False, 1)])
    learner._save()
    feed(learner, [HEALTHY, HEALTHY])  # versions 10 and 11: lost with the learner
    learner.dataset.close()
    restarted = start(config(tiny_model_dir, run, resume=True, life=1))
    feed(restarted, [HEALTHY, HEALTHY, HEALTHY])
    restarted.dataset.close()
    return run


def recorded(run: Path) -> Recorded:
    return Recorded(run, "main", read_ledger(ledger_path(run / "episodes", "main")))


def rerun(run: Path, tiny_model_dir, out: str, **kwargs) -> Rerun:
    return Rerun(recorded(run), config(tiny_model_dir, run), run / "replays" / out, **kwargs)


def test_every_version_replays_bitwise_across_a_rollback_and_a_restart(recorded_run, tiny_model_dir):
    entries = recorded(recorded_run).entries
    updates = [e for e in entries if e["kind"] == "update"]
    assert [e["version"] for e in updates] == list(range(1, 13))  # exactly once: 10 and 11 retrained, once each
    assert any(e["guard"]["rollback"] for e in updates) and any(e["guard"]["anchored"] for e in updates)
    assert [e["kind"] for e in entries].count("dropped_batch") == 1
    assert [(e["version"], e["from"]) for e in entries if e["kind"] == "start"] == [(0, "base"), (9, "checkpoint")]
    result = rerun(recorded_run, tiny_model_dir, "all").run()
    assert result["digests_equal"] == 1.0 and result["versions"] == 12 and result["divergence"] is None, result


def test_a_divergence_planted_in_one_batch_is_found_at_that_version(recorded_run, tiny_model_dir, tmp_path):
    run = tmp_path / "planted"
    copy_run(recorded_run, run)
    target = next(e for e in recorded(run).entries if e["kind"] == "update" and e["version"] == 5)
    path = batch_file(run / "episodes", LIFE, "main", target["batch"]["seq"])
    table = pq.read_table(path)
    logprobs = table.column(Columns.BEHAVIOUR_LOGPROBS).to_pylist()
    logprobs[3][1] -= 0.25  # one token's recorded log-prob
    table = table.set_column(table.schema.get_field_index(Columns.BEHAVIOUR_LOGPROBS), Columns.BEHAVIOUR_LOGPROBS,
                             pa.array(logprobs, table.schema.field(Columns.BEHAVIOUR_LOGPROBS).type))
    pq.write_table(table, path)
    result = rerun(run, tiny_model_dir, "planted").run()
    assert result["versions_equal"] == 4 and result["reached_version"] == 5
    assert result["divergence"].startswith(f"diverged at version 5 (batch {LIFE}/main/{target['batch']['seq']}): "
                                           "tensor ") and "differs first" in result["divergence"]


def test_a_missing_batch_is_refused_with_the_version_it_stops_at(recorded_run, tiny_model_dir, tmp_path):
    run = tmp_path / "missing"
    copy_run(recorded_run, run)
    target = next(e for e in recorded(run).entries if e["kind"] == "update" and e["version"] == 7)
    batch_file(run / "episodes", LIFE, "main", target["batch"]["seq"]).unlink()
    with pytest.raises(ReplayRefused, match="is not in the dataset: the last version that can be replayed is 6"):
        rerun(run, tiny_model_dir, "refused")
    result = rerun(run, tiny_model_dir, "early", to_version=6).run()  # as far as the batches go, and saved there
    assert result["digests_equal"] == 1.0 and result["reached_version"] == 6
    assert checkpoints_at(run, run / "policy").get(6) == Path(result["saved"])


def test_a_replay_from_a_checkpoint_it_saved_goes_on_bitwise(recorded_run, tiny_model_dir, tmp_path):
    run = tmp_path / "from"
    copy_run(recorded_run, run)
    saved = rerun(run, tiny_model_dir, "first", to_version=9).run()["saved"]  # past the rollback at 8
    result = rerun(run, tiny_model_dir, "then", from_checkpoint=Path(saved)).run()
    assert result["from_version"] == 9 and result["versions"] == 3 and result["digests_equal"] == 1.0, result
    early = rerun(run, tiny_model_dir, "early", to_version=4).run()["saved"]  # before the anchor it went back to
    with pytest.raises(ReplayRefused, match="version 8 rolled back to the anchor of version 3, which this replay "
                                            r"\(from version 4\) does not hold"):
        rerun(run, tiny_model_dir, "late", from_checkpoint=Path(early)).run()


def test_a_counterfactual_trains_beside_the_faithful_replay(recorded_run, tiny_model_dir):
    counter = replace(config(tiny_model_dir, recorded_run), objective={"loss": "naive_ppo"})
    replay = rerun(recorded_run, tiny_model_dir, "counter", counter=counter)
    result = replay.run()
    replay.write_report({**result, "counterfactual": "naive_ppo"})
    assert result["digests_equal"] == 1.0  # the faithful side is checked as ever
    kls = [row["kl_recorded_to_counterfactual"] for row in replay.rows]
    assert len(kls) == 12 and kls[-1] > 0 and all(k >= 0 for k in kls)
    assert "clip_fraction_counterfactual" in replay.rows[-1]
    assert "kl_recorded_to_counterfactual" in (recorded_run / "replays" / "counter" / "report.md").read_text()


def test_the_reward_audit_counts_the_episodes_whose_reward_differs(recorded_run, tmp_path, monkeypatch):
    entries = [e for e in recorded(recorded_run).entries if e["kind"] == "update"]
    from actors.learner.rerun import load_batch

    batches = [(e, load_batch(recorded(recorded_run), e["batch"])) for e in entries]
    same = rescore(batches, RewardConfig(), tmp_path / "same")
    assert same["episodes"] == 12 * 4 and same["rescored_differ"] == 0 and same["inconsistent"] == 0, same
    assert same["partial"] == 1  # one turn past the bound was dropped, not trained: its episode is partial

    def generous(episode):  # a scorer that gives seat 1 one more than the game did
        rewards = [r + 1.0 if a == 1 else r for r, a in zip(episode.column(Columns.REWARD).to_pylist(),
                                                             episode.column(Columns.AGENT).to_pylist())]
        return episode.set_column(episode.schema.get_field_index(Columns.REWARD), Columns.REWARD,
                                  pa.array(rewards, pa.float32()))

    monkeypatch.setitem(SCORERS, "generous", generous)
    differ = rescore(batches, RewardConfig(scorer="generous"), tmp_path / "differ")
    assert differ["rescored_differ"] == same["episodes"] - 1  # every episode seats 1; a partial one compares returns
    assert (tmp_path / "differ" / "rescore.jsonl").read_text().count("\n") == differ["rescored_differ"]


def test_the_ledger_is_cut_back_to_the_checkpoint_exactly_once(tmp_path):
    path = tmp_path / "ledger.jsonl"
    digest = {"w": "0123456789abcdef"}
    lines = [{"kind": "start", "format": 1, "version": 0, "digest": digest, "code": "c"}]
    for v in range(1, 6):
        lines.append({"kind": "update", "version": v, "batch": {"life": "a", "member": "main", "seq": v},
                      "lr": 0.1, "seed": v, "guard": {"rollback": 0, "anchored": 0}, "digest": digest,
                      "dropped": {"rows": []}})
        if v == 3:
            lines.append({"kind": "dropped_batch", "version": 3, "batch": {"life": "a", "member": "main", "seq": 9}})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"kind": "upd')  # a write cut short
    assert [e["version"] for e in read_ledger(path)] == [0, 1, 2, 3, 3, 4, 5]  # the cut line left out
    Ledger.opened(path, 3, {"life": "a", "seq": 3})  # a restart at version 3, data cursor 3: batch 9 came after
    assert [(e["kind"], e["version"]) for e in read_ledger(path)] == [("start", 0), ("update", 1), ("update", 2),
                                                                       ("update", 3)]
    assert path.read_text().endswith("\n")


def test_a_ledger_with_a_gap_is_refused_naming_its_line(tmp_path):
    path = tmp_path / "ledger.jsonl"
    digest = {"w": "0123456789abcdef"}
    entries = [{"kind": "start", "format": 1, "version": 0, "digest": digest},
               {"kind": "update", "version": 2, "batch": {"life": "a", "member": "main", "seq": 1}, "lr": 0.1,
                "seed": 0, "guard": {"rollback": 0, "anchored": 0}, "digest": digest}]
    path.write_text("".join(json.dumps(e) + "\n" for e in entries))
    with pytest.raises(LedgerError, match=r"ledger.jsonl:2: version 2 follows version 0: an entry is missing"):
        read_ledger(path)


def copy_run(source: Path, target: Path) -> None:
    import shutil

    shutil.copytree(source, target, ignore=shutil.ignore_patterns("replays"))


def test_a_league_exploiters_reset_replays_bitwise(tiny_model_dir, tmp_path):
    run = tmp_path / "reset"
    learner = start(config(tiny_model_dir, run))
    feed(learner, [HEALTHY, HEALTHY])
    learner._reset()  # back to the base model as version 3 (AlphaStar's exploiter)
    feed(learner, [HEALTHY, HEALTHY])
    learner.dataset.close()
    assert [e["kind"] for e in recorded(run).entries] == ["start", "update", "update", "reset", "update", "update"]
    result = rerun(run, tiny_model_dir, "reset").run()
    assert result["digests_equal"] == 1.0 and result["versions"] == 5, result
