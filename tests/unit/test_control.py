"""The control endpoint of a running run (`tidal scale`): commands over ZeroMQ, checked like every frame."""

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
    server = ControlServer(tmp_path, fake_scale(asked))
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
    finally:
        server.close()
    assert not (tmp_path / CONTROL_FILE).exists()  # a run that ended takes no more commands
