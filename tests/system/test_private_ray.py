"""The embedded Ray cluster is closed to other users: every Ray server listens on loopback only, and there is no
dashboard unless ``ray.dashboard`` asks for one."""

import psutil
import pytest

pytestmark = pytest.mark.ray
LOOPBACK = ("127.0.0.1", "::1", "::ffff:127.0.0.1")


def test_every_ray_process_listens_on_loopback_only(ray_session):
    ray = ray_session

    @ray.remote(num_cpus=0)
    class Probe:  # a worker process, with its own servers
        def ping(self) -> int:
            return 1

    probe = Probe.remote()
    assert ray.get(probe.ping.remote()) == 1
    assert ray.util.get_node_ip_address() == "127.0.0.1"
    listening = []
    for process in psutil.Process().children(recursive=True):
        try:
            name = process.name()
            if not (name.startswith("ray::") or name in ("raylet", "gcs_server") or "ray" in " ".join(
                    process.cmdline()[:3])):
                continue
            listening += [(name, c.laddr.ip, c.laddr.port) for c in process.net_connections(kind="inet")
                          if c.status == psutil.CONN_LISTEN]
        except psutil.Error:  # ended meanwhile
            continue
    assert {"raylet", "gcs_server"} <= {name for name, _, _ in listening}, listening
    assert all(ip in LOOPBACK for _, ip, _ in listening), [entry for entry in listening if entry[1] not in LOOPBACK]
    assert not any("dashboard" in name.lower() for name, _, _ in listening)
    ray.kill(probe)
