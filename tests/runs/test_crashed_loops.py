"""A crashed loop is a dead actor: in its own process (``ActorHost``) the process ends with its own exit status,
so the run restarts it as after a kill; in one process (``LocalCluster``) the run ends, naming the actor. Restarts
are limited and spaced out (``RestartLimit``); past the limit the run stops saying how to resume it."""

import subprocess
import sys
from pathlib import Path

import pytest

from actors.runs.host import CRASH, LOOP_CRASH_EXIT, ActorCrashed, LocalCluster
from actors.runs.recovery import RestartLimit, RestartsExhausted, statistics_or_recover
from tests.factories import Ticker

ROOT = Path(__file__).resolve().parents[2]



HOSTED = """
from actors.runs.host import ActorHost
from tests.factories import Ticker
host = ActorHost(Ticker, None, "ticker-0")
host.start({{}})
assert host.statistics()["ticks"] >= 1
host.call({method!r}, *{args!r})
import time
time.sleep(30)  # the loop's crash ends this process first
print("still alive")
"""


@pytest.mark.parametrize("method, args, raised", [("poke", (), "ValueError: a bug in the ticker"),
                                                  (CRASH, ("chaos",), "the ticker-0 actor's loop raised: chaos")])
def test_an_actor_whose_loop_raises_ends_its_process_with_its_own_status_after_logging_why(method, args, raised):
    done = subprocess.run([sys.executable, "-c", HOSTED.format(method=method, args=args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, env={"PYTHONPATH": str(ROOT)})
    assert done.returncode == LOOP_CRASH_EXIT, done.stderr[-2000:]
    assert "still alive" not in done.stdout
    assert "Traceback" in done.stderr and raised in done.stderr  # the traceback is logged before the end
    assert f"ending its process with status {LOOP_CRASH_EXIT}" in done.stderr


@pytest.mark.parametrize("how", ["poke", CRASH])
def test_in_one_process_a_crashed_actor_ends_the_run_naming_it(how):
    cluster = LocalCluster()
    try:
        cluster.spawn_many([("ticker-0", Ticker, None, {}), ("ticker-1", Ticker, None, {})])
        assert cluster.statistics("ticker-1")["ticks"] >= 1
        cluster.call("ticker-0", how, *(("chaos",) if how == CRASH else ()))
        cluster._loop._thread.join(10)
        with pytest.raises(ActorCrashed, match="the ticker-0 actor's loop raised.*loop has stopped. run.mode=local"):
            cluster.statistics("ticker-1")

        def recover(name, error):  # never: one process cannot restart an actor
            raise AssertionError(f"{name} restarted")

        with pytest.raises(ActorCrashed, match="ticker-0"):  # the run's health check: the run ends
            statistics_or_recover(cluster, ["ticker-1", "ticker-0"], recover)
    finally:
        cluster.shutdown()


def test_restarts_are_spaced_out_and_limited_within_the_window():
    now = [0.0]
    limit = RestartLimit(max_restarts=3, window_s=100.0, backoff_s=2.0, clock=lambda: now[0])
    assert limit.delay("replay") == 0.0  # the first, at once
    limit.restarted("replay")
    now[0] = 1.0
    assert limit.delay("replay") == 1.0 and limit.delay("reward") == 0.0  # 2 s after the first; per actor
    now[0] = 2.0
    limit.restarted("replay")
    assert limit.delay("replay") == 4.0  # then twice as long
    now[0] = 10.0
    limit.restarted("replay")
    with pytest.raises(RestartsExhausted, match=r"replay died again after 3 restarts within 100 s "
                                                r"\(run.max_restarts=3"):
        limit.delay("replay")
    now[0] = 100.5  # the first restart left the window: one more is allowed (its backoff has long passed)
    assert limit.delay("replay") == 0.0
    now[0] = 10.5
    limit.times["replay"] = [10.0]
    assert limit.delay("replay") == 1.5


def test_the_driver_waits_between_restarts_and_stops_past_the_limit_saying_how_to_resume(tmp_path, monkeypatch):
    from actors.cli import load_config
    from actors.runs import driver as driver_module
    from actors.runs.evaluations import Evaluations
    from actors.runs.recovery import GroupRecovery
    from actors.runs.topology import Topology, plan_groups
    from tests.factories import FakeCluster

    cfg = load_config([f"run.dir={tmp_path}", "run.name=r", "run.max_restarts=2", "run.restart_backoff_s=3"])
    run = driver_module.Driver(cfg)
    slept = []
    monkeypatch.setattr(driver_module.time, "sleep", slept.append)
    top = Topology(plan_groups(cfg, "base", run.dir), envs=["env-0"])
    run.cluster = cluster = FakeCluster()
    run.top = top
    run.evaluations = Evaluations(cluster, top.envs, cfg.eval, None, [])
    run.recoveries = {"main": GroupRecovery(cluster, top.groups["main"], top.envs)}
    run.recover("learner", RuntimeError())
    run.recover("learner", RuntimeError())
    assert [changes["life"] for name, changes in cluster.restarted] == [1, 2]  # each start a new life
    assert slept[0] == 0 and 2.5 < slept[1] <= 3.0  # the second restart waited for the backoff
    with pytest.raises(RuntimeError, match=r"learner died again after 2 restarts within 600 s .*the run stops; "
                                           rf"continue it with `tidal launch resume={run.dir}`"):
        run.recover("learner", RuntimeError())
    assert len(cluster.restarted) == 2 and run.restarts == {"learner": 2}


@pytest.mark.parametrize("override, message", [("run.max_restarts=0", "run.max_restarts=0: must be >= 1"),
                                               ("run.restart_window_s=0", "run.restart_window_s=0.0: must be > 0"),
                                               ("run.restart_backoff_s=-1", "run.restart_backoff_s=-1.0: must be >= 0")])
def test_restart_limits_out_of_range_are_refused_naming_the_key(override, message):
    from actors.cli import load_config

    with pytest.raises(ValueError, match=message):
        load_config([override])


FULL_DISK = """
from actors.runs.host import ActorHost, DiskFull
from tests.factories import Ticker
import time
host = ActorHost(Ticker, None, "replay")
host.start({})
host.call("poke", "disk")
deadline = time.monotonic() + 20
while time.monotonic() < deadline:
    try:
        host.statistics()
    except DiskFull as error:
        print("refused:", error)
        break
    time.sleep(0.05)
print("still alive")
"""


def test_an_actor_that_finds_its_disk_full_keeps_its_process_and_says_why():
    """Review new 9: a dead process's cause never reaches the driver, and a restart would meet the same disk."""
    done = subprocess.run([sys.executable, "-c", FULL_DISK], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert ("refused: the replay actor found its disk full under /runs/r/replay/life (No space left on device: "
            "/runs/r/replay/life/batches.jsonl)") in done.stdout
    assert "still alive" in done.stdout and "the process stays" in done.stderr


def test_in_one_process_a_full_disk_ends_the_run_naming_the_actor_and_the_directory():
    from actors.runs.host import DiskFull

    cluster = LocalCluster()
    try:
        cluster.spawn_many([("replay", Ticker, None, {})])
        cluster.call("replay", "poke", "disk")
        cluster._loop._thread.join(10)
        with pytest.raises(DiskFull, match="the replay actor found its disk full under /runs/r/replay/life"):
            cluster.statistics("replay")
    finally:
        cluster.shutdown()


def test_a_full_disk_ends_the_run_at_once_naming_where_and_what_it_needs(tmp_path):
    import pickle

    from actors.cli import load_config
    from actors.runs import driver as driver_module
    from actors.runs.host import DiskFull
    from actors.runs.topology import Topology, plan_groups
    from tests.factories import FakeCluster

    class RayTaskErrorLike(DiskFull):  # Ray's shape: a subclass of the actor's error, which is its ``cause``
        def __init__(self, cause):
            Exception.__init__(self, cause)
            self.cause = cause

        def __str__(self):
            return "ray::ActorHost.statistics() (pid=1, ip=127.0.0.1)"

    class FullReplay(FakeCluster):
        def statistics(self, name):
            if name == "replay":  # pickled on its way from the actor's process
                cause = pickle.loads(pickle.dumps(DiskFull("replay", str(tmp_path / "r" / "replay"), "No space")))
                raise RayTaskErrorLike(cause)
            return super().statistics(name)

        def is_dead(self, error):  # Ray: a raised error (RayTaskError), not a dead actor (RayActorError)
            return not isinstance(error, DiskFull)

    cfg = load_config([f"run.dir={tmp_path}", "run.name=r", "model.path=/m", "observe.tensorboard=false"])
    run = driver_module.Driver(cfg)
    run.base_model = tmp_path / "model"
    run.base_model.mkdir()
    (run.base_model / "model.safetensors").write_bytes(b"\0" * 2**20)
    run.cluster, run.top = FullReplay(), Topology(plan_groups(cfg, "base", run.dir), envs=["env-0"])
    with pytest.raises(RuntimeError) as ended:
        run._tick()
    message = str(ended.value)
    assert f"the replay actor found its disk full under {tmp_path}/r/replay" in message
    assert "MiB free; the run needs at least 6 MiB free under" in message  # two checkpoints of 3 x 1 MiB
    assert f"continue it with `tidal launch resume={run.dir} model.path=/m`" in message
    assert run.cluster.restarted == [] and run.restarts == {}  # no restart spent on it
