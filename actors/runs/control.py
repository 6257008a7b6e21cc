"""Commands to a running run: ``tidal scale rollout=N`` reaches the run through a control endpoint.

The run binds a ZeroMQ REP socket on loopback and writes its address to ``<run dir>/control.json``; the CLI
sends a ``ScaleRequest`` frame (msgpack, checked field by field like every frame) and prints the
``ScaleAnswered``. A malformed or unknown frame gets an answer saying so and changes nothing. The endpoint
lives in the driver's process (a thread), beside the run's loop, which applies the scale at its next round.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import zmq

from streams.messages import ScaleAnswered, ScaleRequest
from streams.wire import FrameCounter, FrameError, Kind, decode_frame

log = logging.getLogger(__name__)
CONTROL_FILE = "control.json"
POLL_MS = 200  # how often the serving thread looks whether it should stop


class ControlServer:
    """Serves scale commands for ``scale(actor, count) -> int`` (raising ValueError for a bad one)."""

    def __init__(self, run_dir: Path, scale):
        self.path = Path(run_dir) / CONTROL_FILE
        self.scale = scale
        self._socket = zmq.Context.instance().socket(zmq.REP)
        self._socket.setsockopt(zmq.MAXMSGSIZE, 2**16)
        self._socket.bind("tcp://127.0.0.1:*")
        self.address = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self._frames = FrameCounter("run")
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="tidal-control", daemon=True)
        self._thread.start()
        self.path.write_text(json.dumps({"address": self.address}))

    def _serve(self) -> None:
        while not self._stopped.is_set():
            if not self._socket.poll(POLL_MS):
                continue
            parts = self._socket.recv_multipart()
            self._socket.send_multipart(self._frames.frame(Kind.SCALED, self.answer(parts).to_body()))

    def answer(self, parts: list) -> ScaleAnswered:
        try:
            header, body = decode_frame(parts)
            if header.kind != Kind.SCALE:
                raise FrameError(f"a {header.kind.value!r} frame where a scale command was expected", "wrong_kind")
            request = ScaleRequest.from_body(body)
            actors = self.scale(request.actor, request.count)
        except (FrameError, ValueError) as error:
            log.warning("control: refused a command: %s", error)
            return ScaleAnswered(False, str(error))
        return ScaleAnswered(True, f"scaling {request.actor} actors to {request.count}", actors)

    def close(self) -> None:
        self._stopped.set()
        self._thread.join()
        self._socket.close(linger=0)
        self.path.unlink(missing_ok=True)


def send_scale(run_dir: str | Path, actor: str, count: int, timeout_s: float = 10.0) -> ScaleAnswered:
    """Ask the run in ``run_dir`` for ``count`` actors of kind ``actor``; its answer."""
    path = Path(run_dir) / CONTROL_FILE
    if not path.exists():
        raise FileNotFoundError(f"{run_dir}: no {CONTROL_FILE}: the run is not running (or runs in run.mode=local)")
    address = json.loads(path.read_text())["address"]
    socket = zmq.Context.instance().socket(zmq.REQ)
    try:
        socket.connect(address)
        socket.send_multipart(FrameCounter("tidal-scale").frame(Kind.SCALE, ScaleRequest(actor, count).to_body()))
        if not socket.poll(int(timeout_s * 1000)):
            raise TimeoutError(f"the run at {address} did not answer within {timeout_s:.0f} s (has it ended?)")
        header, body = decode_frame(socket.recv_multipart())
        if header.kind != Kind.SCALED:
            raise FrameError(f"the run answered with a {header.kind.value!r} frame", "wrong_kind")
        return ScaleAnswered.from_body(body)
    finally:
        socket.close(linger=0)


def latest_run(runs_dir: str | Path) -> Path:
    """The most recently started run under ``runs_dir`` that is running (has a control endpoint)."""
    running = sorted(Path(runs_dir).glob(f"*/{CONTROL_FILE}"), key=lambda p: p.stat().st_mtime)
    if not running:
        raise FileNotFoundError(f"no running run under {runs_dir} (none has a {CONTROL_FILE}): name one with --run")
    return running[-1].parent
