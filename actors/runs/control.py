"""Commands to a running run: ``tidal scale rollout=N`` and ``tidal stop`` reach the run through a control endpoint.

The run binds a ZeroMQ REP socket and writes its address to ``<run dir>/control.json``; the CLI sends a
``ScaleRequest`` or ``StopRequest`` frame (msgpack, checked field by field like every frame) and prints the
``ScaleAnswered``. A malformed or unknown frame gets an answer saying so and changes nothing. The endpoint
lives in the driver's process (a thread), beside the run's loop, which applies the command at its next round.

Only this user can reach it: the socket is a Unix socket (``ipc://``) in a private directory of the driver's
(mode 0700, ``streams/private_files.py``), not a TCP port any local user could connect to, and ``control.json``
is written 0600.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import zmq

from streams.messages import ScaleAnswered, ScaleRequest, StopRequest
from streams.private_files import SOCKET_ROOT, private_dir, remove_private_dir, write_private
from streams.wire import FrameCounter, FrameError, Kind, decode_frame

log = logging.getLogger(__name__)
CONTROL_FILE = "control.json"
POLL_MS = 200  # how often the serving thread looks whether it should stop


class ControlServer:
    """Serves commands: ``scale(actor, count) -> int`` (raising ValueError for a bad one) and ``stop(evaluate)``."""

    def __init__(self, run_dir: Path, scale, stop):
        self.path = Path(run_dir) / CONTROL_FILE
        self.scale, self.stop = scale, stop
        self._directory = private_dir(SOCKET_ROOT, "control")
        self._socket = zmq.Context.instance().socket(zmq.REP)
        self._socket.setsockopt(zmq.MAXMSGSIZE, 2**16)
        self._socket.bind(f"ipc://{self._directory}/control")
        self.address = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self._frames = FrameCounter("run")
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="tidal-control", daemon=True)
        self._thread.start()
        write_private(self.path.parent, CONTROL_FILE, json.dumps({"address": self.address}))

    def _serve(self) -> None:
        while not self._stopped.is_set():
            if not self._socket.poll(POLL_MS):
                continue
            parts = self._socket.recv_multipart()
            self._socket.send_multipart(self._frames.frame(Kind.SCALED, self.answer(parts).to_body()))

    def answer(self, parts: list) -> ScaleAnswered:
        try:
            header, body = decode_frame(parts)
            if header.kind == Kind.STOP:
                evaluate = StopRequest.from_body(body).evaluate
                self.stop(evaluate)
                log.warning("control: stopping the run (tidal stop%s)", "" if evaluate else " --now")
                return ScaleAnswered(True, "stopping: training ends at the next round" +
                                     (", then the final evaluation" if evaluate else ""))
            if header.kind != Kind.SCALE:
                raise FrameError(f"a {header.kind.value!r} frame where a command was expected", "wrong_kind")
            request = ScaleRequest.from_body(body)
            actors = self.scale(request.actor, request.count)
        except (FrameError, ValueError) as error:
            log.warning("control: refused a command: %s", error)
            return ScaleAnswered(False, str(error))
        except Exception as error:  # the endpoint must outlive any command: a bug here is an answer, not its end
            log.exception("control: a command failed")
            return ScaleAnswered(False, f"the command failed: {type(error).__name__}: {error}")
        return ScaleAnswered(True, f"scaling {request.actor} actors to {request.count}", actors)

    def close(self) -> None:
        self._stopped.set()
        self._thread.join()
        self._socket.close(linger=0)
        self.path.unlink(missing_ok=True)
        remove_private_dir(self._directory)


def send_scale(run_dir: str | Path, actor: str, count: int, timeout_s: float = 10.0) -> ScaleAnswered:
    """Ask the run in ``run_dir`` for ``count`` actors of kind ``actor``; its answer."""
    return send_command(run_dir, Kind.SCALE, ScaleRequest(actor, count).to_body(), timeout_s)


def send_stop(run_dir: str | Path, evaluate: bool = True, timeout_s: float = 10.0) -> ScaleAnswered:
    """Ask the run in ``run_dir`` to end (``evaluate``: after its final evaluation); its answer."""
    return send_command(run_dir, Kind.STOP, StopRequest(evaluate).to_body(), timeout_s)


def send_command(run_dir: str | Path, kind: Kind, body: bytes, timeout_s: float) -> ScaleAnswered:
    path = Path(run_dir) / CONTROL_FILE
    if not path.exists():
        raise FileNotFoundError(f"{run_dir}: no {CONTROL_FILE}: the run is not running")
    address = json.loads(path.read_text())["address"]
    socket = zmq.Context.instance().socket(zmq.REQ)
    try:
        socket.connect(address)
        socket.send_multipart(FrameCounter("tidal-control").frame(kind, body))
        if not socket.poll(int(timeout_s * 1000)):
            raise TimeoutError(f"the run at {address} did not answer within {timeout_s:.0f} s (has it ended?)")
        header, answer = decode_frame(socket.recv_multipart())
        if header.kind != Kind.SCALED:
            raise FrameError(f"the run answered with a {header.kind.value!r} frame", "wrong_kind")
        return ScaleAnswered.from_body(answer)
    finally:
        socket.close(linger=0)


def latest_run(runs_dir: str | Path) -> Path:
    """The most recently started run under ``runs_dir`` that is running (has a control endpoint)."""
    running = sorted(Path(runs_dir).glob(f"*/{CONTROL_FILE}"), key=lambda p: p.stat().st_mtime)
    if not running:
        raise FileNotFoundError(f"no running run under {runs_dir} (none has a {CONTROL_FILE}): name one with --run")
    return running[-1].parent
