"""Files closed to other local users: shared-memory weights, CURVE keys, Ray's token; and what a killed process
left behind is swept."""

import os
import signal
import stat
import subprocess
import sys

import pytest
import trio

from actors.runs.ray_cluster import RayCluster, private_ray_token
from streams.endpoints import Outbox
from streams.memory_channels import MemoryTransport
from streams.private_files import private_dir, sweep_stale, write_private
from streams.security import CurveKeys
from streams.weights import WeightsPublisher, _map_file
from streams.wire import Kind


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_weight_files_are_0600_in_a_0700_directory_and_a_planted_link_is_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"not weights")

    async def publish():
        async with MemoryTransport().open_publisher(capacity=4) as publisher:
            weights = WeightsPublisher("learner", "main", Outbox(publisher, Kind.WEIGHTS, "learner", topic=b"w"), "mem://x",
                                       directory=str(tmp_path))
            first = await weights.publish(0, b"version 0")
            # another process of this user plants a link at the next version's name (nobody else can: 0700)
            os.symlink(victim, weights.directory / "learner-main-v1.safetensors")
            second = await weights.publish(1, b"version 1")
            return weights, first, second

    weights, first, second = trio.run(publish)
    assert mode(weights.directory) == 0o700 and weights.directory.parent == tmp_path
    for manifest in (first, second):
        assert mode(manifest.path) == 0o600 and stat.S_ISREG(os.lstat(manifest.path).st_mode)
    assert victim.read_bytes() == b"not weights"  # replaced the link, did not write through it
    assert bytes(_map_file(second.path)) == b"version 1"
    os.unlink(second.path)
    os.symlink(victim, second.path)  # a reader does not follow a link at a manifest's path either
    assert _map_file(second.path) is None
    weights.close()
    assert not weights.directory.exists() and victim.exists()


def test_write_private_refuses_nothing_it_should_not_and_leaves_no_partial_file(tmp_path):
    path = write_private(tmp_path, "a", b"1")
    write_private(tmp_path, "a", b"22")  # a new version replaces the old one whole
    assert path.read_bytes() == b"22" and mode(path) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


def test_a_killed_processs_directory_is_swept_and_nothing_else(tmp_path):
    writer = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from streams.private_files import private_dir, write_private\n"
        f"d = private_dir({str(tmp_path)!r}, 'learner-main'); write_private(d, 'w.safetensors', b'x' * 100)\n"
        "print(d, flush=True); time.sleep(120)")], stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    left = writer.stdout.readline().strip()
    mine = private_dir(tmp_path, "rollout-0")  # this process's: alive
    assert sweep_stale(tmp_path) == [] and os.path.isdir(left)  # its owner still runs
    writer.send_signal(signal.SIGKILL)  # no cleanup runs
    writer.wait()
    target = tmp_path / "kept"
    target.mkdir()
    dead_pid_name = os.path.basename(left)
    link = tmp_path / dead_pid_name.replace("learner", "linked")  # a link under a dead owner's name: not followed
    link.symlink_to(target)
    other_user = tmp_path / "tidal-someoneelse-0-1-x"
    other_user.mkdir()
    removed = sweep_stale(tmp_path)
    assert [str(p) for p in removed] == [left] and not os.path.exists(left)
    assert mine.is_dir() and link.is_symlink() and target.is_dir() and other_user.is_dir()


def test_curve_keys_are_written_private_and_refused_when_looser(tmp_path):
    keys = tmp_path / "keys"
    CurveKeys.create(str(keys))
    assert mode(keys) == 0o700
    assert {p.name: mode(p) for p in keys.iterdir()} == {f"{n}{s}": 0o600 for n in ("server", "client")
                                                         for s in (".key", ".key_secret")}
    assert CurveKeys.load(str(keys)).server_secret
    os.chmod(keys / "server.key_secret", 0o644)
    with pytest.raises(PermissionError, match=r"server\.key_secret.*mode 0644.*chmod 600"):
        CurveKeys.load(str(keys))
    with pytest.raises(PermissionError, match="chmod 600"):  # found by the launcher, before any actor starts
        RayCluster(curve_dir=str(keys))
    os.chmod(keys / "server.key_secret", 0o600)
    os.chmod(keys, 0o755)
    with pytest.raises(PermissionError, match=r"directory \(mode 0755\).*chmod 700"):
        CurveKeys.load(str(keys))
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o777)
    os.chmod(loose, 0o777)
    with pytest.raises(PermissionError, match="chmod 700"):  # create does not write secrets where others can
        CurveKeys.create(str(loose))
    assert list(loose.iterdir()) == []


def test_rays_token_file_is_made_0600_or_narrowed_to_it(tmp_path, monkeypatch):
    for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    token = private_ray_token(create=True)
    assert token == tmp_path / ".ray" / "auth_token" and mode(token) == 0o600 and mode(token.parent) == 0o700
    assert len(token.read_text()) == 64 and int(token.read_text(), 16) >= 0  # what Ray's generator makes
    os.chmod(token, 0o644)  # as Ray 2.60 writes it
    private_ray_token(create=False)
    assert mode(token) == 0o600


def test_vllms_weight_file_is_0600_in_a_private_directory(tmp_path):
    from actors.rollout.vllm_engine import VllmOptions, VllmSampler

    sampler = object.__new__(VllmSampler)  # no engine: only the path its workers load weights from
    sampler.options, sampler.name, sampler._weights_dir = VllmOptions(weights_dir=str(tmp_path)), "rollout-0", None
    sampler._write(b"version 1")
    sampler._write(b"version 2")
    directory = sampler._weights_dir
    assert directory.parent == tmp_path and mode(directory) == 0o700
    assert [(p.name, mode(p)) for p in directory.iterdir()] == [("model.safetensors", 0o600)]
    assert (directory / "model.safetensors").read_bytes() == b"version 2"
    assert sweep_stale(tmp_path) == []  # its owner (this process) lives
