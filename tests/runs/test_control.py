"""The control endpoint of a running run (`tidal scale`, `tidal stop`): commands over ZeroMQ, checked like every
frame, on a socket only this user can reach."""

import json
import os
import stat
from pathlib import Path

import zmq

from actors.cli import main
from actors.runs.control import CONTROL_FILE, ControlServer, latest_run, send_scale
from streams.messages import ScaleAnswered
from streams.wire import FrameCounter, Kind, decode_frame


def fake_scale(asked: list):
    def scale(actor: str, count: int) -> int:
        if actor != "rollout":
            raise ValueError(f"cannot scale {actor!r} actors")
        asked.append((actor, count))
        return 1
    return scale


def test_a_scale_command_reaches_the_run_and_a_bad_one_is_refused_with_its_reason(tmp_path):
    asked, runs = [], tmp_path
    tmp_path = runs / "run-1"
    tmp_path.mkdir()
    stops = []
    server = ControlServer(tmp_path, fake_scale(asked), stops.append)
    try:
        assert latest_run(runs) == tmp_path
        answer = send_scale(tmp_path, "rollout", 4)
        assert answer == ScaleAnswered(True, "scaling rollout actors to 4", 1) and asked == [("rollout", 4)]
        refused = send_scale(tmp_path, "learner", 2)
        assert not refused.ok and "cannot scale 'learner'" in refused.message and len(asked) == 1
        # a frame of another kind, and one whose body is not a scale command: answered, nothing changes
        socket = zmq.Context.instance().socket(zmq.REQ)
        socket.connect(server.address)
        for parts in (FrameCounter("x").frame(Kind.VERSION, b"\x80"), FrameCounter("x").frame(Kind.SCALE, b"\x01")):
            socket.send_multipart(parts)
            assert socket.poll(5000)
            answer = ScaleAnswered.from_body(decode_frame(socket.recv_multipart())[1])
            assert not answer.ok and answer.message
        socket.close(0)
        assert len(asked) == 1
        assert main(["scale", "--run", str(tmp_path), "rollout=2"]) == 0 and asked[-1] == ("rollout", 2)
        assert main(["scale", "--run", str(tmp_path), "rollout=two"]) == 2
        assert main(["scale", "--run", str(tmp_path), "rollout=\u0664"]) == 2  # a digit, not an ASCII one
        assert main(["scale", "--run", str(tmp_path), f"rollout={2**70}"]) == 2 and asked[-1] == ("rollout", 2)
        assert main(["stop", "--run", str(tmp_path), "--now"]) == 0 and stops == [False]
        assert main(["stop", "--run", str(tmp_path)]) == 0 and stops == [False, True]
    finally:
        server.close()
    assert not (tmp_path / CONTROL_FILE).exists()  # a run that ended takes no more commands


def test_the_control_endpoint_is_a_socket_in_a_private_directory_and_its_file_is_0600(tmp_path):
    server = ControlServer(tmp_path, fake_scale([]), lambda evaluate: None)
    try:
        address = json.loads((tmp_path / CONTROL_FILE).read_text())["address"]
        assert address.startswith("ipc://")  # not a TCP port that any local user may connect to
        directory = Path(address.removeprefix("ipc://")).parent
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700 and os.stat(directory).st_uid == os.getuid()
        assert stat.S_IMODE(os.stat(tmp_path / CONTROL_FILE).st_mode) == 0o600
    finally:
        server.close()
    assert not directory.exists()


def test_a_scale_above_the_configured_maximum_is_refused_naming_the_key(tmp_path):
    from types import SimpleNamespace

    import pytest

    from actors.cli import load_config
    from actors.runs.scaling import Scaler

    with pytest.raises(ValueError, match=r"rollout.count=20 is above rollout.max_count=16"):
        load_config(["rollout.count=20"])
    cfg = load_config(["run.mode=ray", "rollout.max_count=8", "env.max_count=3"])
    scaler = Scaler(SimpleNamespace(cfg=cfg, top=SimpleNamespace(league=None, groups={"main": None})))

    def scale(kind: str, count: int) -> int:
        scaler.check(kind, count)
        return 1

    server = ControlServer(tmp_path, scale, lambda evaluate: None)
    try:
        refused = send_scale(tmp_path, "rollout", 1_000_000)
        assert not refused.ok and "at most 8 (rollout.max_count" in refused.message, refused.message
        refused = send_scale(tmp_path, "env", 4)
        assert not refused.ok and "at most 3 (env.max_count" in refused.message, refused.message
        assert send_scale(tmp_path, "rollout", 8).ok and send_scale(tmp_path, "env", 3).ok
    finally:
        server.close()
        scaler.close()
