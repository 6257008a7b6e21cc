"""A learner group on Ray: ``learner.ranks=2`` trains the run on two gloo ranks (FSDP2), and a rank killed
mid-run restarts the group from its checkpoint, losing and repeating no episode."""

import os
import signal

import pytest

from actors.cli import saved_config
from actors.models.checkpoints import checkpoint_cursor
from actors.replay.spill import account_episodes
from actors.runs.replaying import replay
from tests.factories import wait_for
from tests.factories import BackgroundRun, small_config

pytestmark = pytest.mark.ray


def test_two_learner_ranks_train_and_a_killed_rank_restarts_the_group_losing_nothing(ray_session, tiny_model_dir,
                                                                                     tmp_path):
    cfg = small_config(tmp_path, **{"model.path": tiny_model_dir, "run.max_versions": 10, "run.minutes": 6,
                                    "run.log_every_s": 0.5, "learner.ranks": 2, "learner.checkpoint_every": 3,
                                    "run.ledger": True})
    background = BackgroundRun(cfg)
    run = background.run
    try:
        wait_for(lambda: background.last_row({"version": 0})["version"] >= 4, "the group's first updates", timeout=240)
        assert run.top.groups["main"].learner_ranks == ["learner-rank1"]
        rank = ray_session.get_actor("learner-rank1")
        assert ray_session.get(rank.statistics.remote())["state"] == "serving"
        os.kill(ray_session.get(rank.pid.remote()), signal.SIGKILL)
    finally:
        summary = background.join(timeout=400)
    # the dead rank, or rank 0 first (it ends its process once a collective fails): the group restarts once
    assert not summary["interrupted"] and summary["restarts"] in ({"learner-rank1": 1}, {"learner": 1})
    assert summary["final_version"] >= 10
    run_dir = tmp_path / "test"
    assert (run_dir / "policy" / "optimizer").is_dir()  # written by both ranks (torch.distributed.checkpoint)
    accounts = account_episodes(run_dir, summary["life"], checkpoint_cursor(run_dir / "policy", summary["life"]))
    assert accounts["lost"] == 0 and accounts["duplicated"] == 0, accounts
    assert accounts["consumed"] >= 8 * 10, accounts
    # the group re-run from its records on two ranks, the group's restart included: every version bit for bit
    replayed = replay(run_dir, saved_config(str(run_dir), [f"model.path={tiny_model_dir}"], "replay"))
    assert replayed["ranks"] == 2 and replayed["digests_equal"] == 1.0 and replayed["versions"] >= 10, replayed
