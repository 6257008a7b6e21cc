"""A hung actor on the real path: a Ray actor's process stopped with SIGSTOP is alive to Ray and answers nothing.
The health check gives up on it within its deadline (the driver used to wait for ever), restarts it once it has
been silent ``ping_misses`` checks in a row, and a cluster shuts down without waiting for a stopped actor."""

import os
import signal

import psutil
import pytest

from actors.runs.ray_cluster import RayCluster
from actors.runs.recovery import HungActor, Liveness, statistics_or_recover
from tests.factories import Ticker, TickerConfig, wait_for

pytestmark = pytest.mark.ray


def test_a_stopped_actor_is_restarted_after_its_misses_and_the_others_go_on(ray_session):
    cluster = RayCluster(liveness=Liveness(timeout_s=1.0, misses=2))
    stopped = []
    try:
        cluster.spawn_many([(name, Ticker, TickerConfig(), {}) for name in ("ticker-0", "ticker-1")])
        names, restarted = ["ticker-0", "ticker-1"], []

        def recover(name, error):
            restarted.append((name, type(error)))
            cluster.restart(name)
            return cluster.statistics(name)

        before = statistics_or_recover(cluster, names, recover)
        pid = cluster.places["ticker-0"]["pid"]
        os.kill(pid, signal.SIGSTOP)
        stopped.append(pid)
        silent = statistics_or_recover(cluster, names, recover)  # within the deadline, not for ever
        assert silent["ticker-0"] == before["ticker-0"] and cluster.liveness.silent() == ["ticker-0"]
        assert not restarted
        after = statistics_or_recover(cluster, names, recover)
        assert restarted == [("ticker-0", HungActor)] and cluster.places["ticker-0"]["pid"] != pid
        assert after["ticker-0"]["ticks"] >= 1 and after["ticker-1"]["ticks"] > before["ticker-1"]["ticks"]
        wait_for(lambda: gone(pid), "the hung process killed", timeout=30)

        last = cluster.places["ticker-1"]["pid"]
        os.kill(last, signal.SIGSTOP)  # stuck at the end of the run: shut down without its stop
        stopped.append(last)
    finally:
        cluster.shutdown()
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    wait_for(lambda: all(gone(pid) for pid in stopped), "the stopped processes killed", timeout=30)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
