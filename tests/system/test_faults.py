"""Faults on the real path, a small chaos run: one actor of every kind killed with SIGKILL mid-run (the reward actor
crashed instead: its loop raises) is restarted, rollout actors are scaled 2 -> 3 -> 1 meanwhile (through the run's
control endpoint), the run goes on, and every training episode is accounted for by id: none lost, none trained
twice. The learner is killed between two checkpoints: it comes back at an older version, as a new life, which the
rollout and env actors follow. (`benchmarks/chaos.py --quick`, the bigger one, is in the slow suite.)"""

import os
import signal

import pytest

from actors.cli import saved_config
from actors.learner.ledger import ledger_path, read_ledger
from actors.runs.replaying import replay
from actors.runs.host import CRASH
from actors.runs.control import send_scale
from actors.models.checkpoints import checkpoint_cursor
from actors.replay.spill import account_episodes
from tests.factories import wait_for
from tests.factories import BackgroundRun, dataset_accounts, small_config

pytestmark = pytest.mark.ray

VICTIMS = ["reward", "replay", "learner", "env-0", "rollout-0"]
SCALES = {"reward": 3, "env-0": 1}  # rollout actors asked for just before killing these
CRASHED = {"reward"}  # an exception raised inside its running loop ends its process


def test_every_kind_killed_is_restarted_and_no_episode_is_lost_or_trained_twice(ray_session, tiny_model_dir,
                                                                                 tmp_path):
    cfg = small_config(tmp_path, **{"model.path": tiny_model_dir, "run.max_versions": 12, "run.minutes": 6,
                                    "run.log_every_s": 0.5, "rollout.count": 2, "env.count": 2,
                                    "learner.checkpoint_every": 3, "run.ledger": True})
    background = BackgroundRun(cfg)
    run = background.run

    def last_row() -> dict:
        return background.last_row({"version": 0, "restarts": 0})

    try:
        for killed, victim in enumerate(VICTIMS):
            # the previous victim is back and learning goes on (a restarted learner retrains to where it was)
            wait_for(lambda: last_row()["restarts"] == killed and last_row()["version"] >= killed + 2,
                     f"progress before killing {victim}", timeout=240)
            if victim in SCALES:  # as `tidal scale rollout=N` does: through the run's control endpoint
                assert send_scale(run.dir, "rollout", SCALES[victim]).ok
            actor = ray_session.get_actor(victim)
            if victim == "learner":  # between two checkpoints (every 3 versions): it comes back at an older one
                wait_for(lambda: ray_session.get(actor.statistics.remote())["version"] % 3 == 1, "a learner between "
                         "checkpoints", timeout=120)
                killed_at = ray_session.get(actor.statistics.remote())["version"]
            if victim in CRASHED:
                try:
                    ray_session.get(actor.call.remote(CRASH, "a test's crash"))
                except ray_session.exceptions.RayActorError:
                    pass  # it ended before it answered
            else:
                os.kill(ray_session.get(actor.pid.remote()), signal.SIGKILL)
            if victim == "learner":
                assert_followed_a_new_life(ray_session, run, killed_at)
    finally:
        summary = background.join(timeout=400)
    assert not summary["interrupted"] and summary["restarts"] == dict.fromkeys(VICTIMS, 1)
    assert summary["final_version"] >= 12 and summary["final_nonloss"] is not None
    assert [(e["from"], e["to"]) for e in summary["scale_events"]] == [(2, 3), (3, 1)]
    assert run.top.groups["main"].rollouts == ["rollout-0"]
    run = tmp_path / "test"
    accounts = account_episodes(run, summary["life"], checkpoint_cursor(run / "policy", summary["life"]))
    assert accounts["lost"] == 0 and accounts["duplicated"] == 0, accounts
    assert accounts["consumed"] >= 8 * 12 and accounts["unledgered"] <= 8, accounts  # at most env-0's slots
    # the episode dataset: every episode the surviving learner trained, once, across its kill (its batches past
    # the checkpoint were written again as it trained them again)
    trained = dataset_accounts(run)
    assert sum(trained["per_life"].values()) == trained["trained"] > 0 and trained["twice"] == [], trained
    # the learner's ledger: each version once across the kill (the updates past the checkpoint recorded again as
    # they were made again), and the learner re-run from the records reproduces every version bit for bit
    starts = [e for e in read_ledger(ledger_path(run / "episodes", "main")) if e["kind"] == "start"]
    assert [(e["life"], e["from"]) for e in starts] == [(0, "base"), (1, "checkpoint")], starts
    replayed = replay(run, saved_config(str(run), [f"model.path={tiny_model_dir}"], "replay"))
    assert replayed["digests_equal"] == 1.0 and replayed["versions"] >= 12, replayed
    rows = background.rows()
    assert all(r.get("tokens_per_s", 0) >= 0 and r.get("episodes_per_s", 0) >= 0 for r in rows)  # totals go on
    assert rows[-1]["reissued_requests"] > 0  # the dead rollout actor's requests were asked again


def assert_followed_a_new_life(ray, run, killed_at: int) -> None:
    """The learner restarted at its checkpoint, below the version it was killed at, as life 1; every rollout actor
    takes that life's weights (none samples with the dead life's) and every env actor counts admission against it."""
    recovery = run.recoveries["main"]
    wait_for(lambda: recovery.learner_starts, "the learner's restart", timeout=240)
    start = recovery.learner_starts[-1]
    assert start["life"] == 1 and start["version"] < killed_at and start["version"] % 3 == 0, (start, killed_at)

    def followed() -> bool:
        rollouts = [ray.get(ray.get_actor(r).statistics.remote()) for r in run.top.groups["main"].rollouts]
        envs = [ray.get(ray.get_actor(e).statistics.remote()) for e in run.top.envs]
        return (all(r["learner_life"] == 1 and r["life"] in (1, None) for r in rollouts)
                and all(e["learner_lives"] == {"main": 1} for e in envs))

    wait_for(followed, "the rollout and env actors to follow the learner's new life", timeout=120)
    learner = ray.get(ray.get_actor("learner").statistics.remote())
    assert learner["life"] == 1
    assert max(int(k) for k in learner["staleness_hist"]) <= run.cfg.learner.max_staleness
