"""One driver per run directory: the driver holds an ``flock`` on ``<run dir>/.lock`` for the run's life.

Two drivers on one run directory would both swap the learner's checkpoint (``policy``, ``.old``, ``.new``), and the
second replay would take over the live one's spill. So a run's driver takes the lock before it writes anything
there, and ``tidal launch resume=<dir>`` or ``tidal export <dir>`` while another process holds it is refused,
naming the run and the holder. The lock is the kernel's: it goes with the process that held it, however that
process ended (a SIGKILL leaves the file, not the lock), and it is not inherited by the processes the driver
starts (Python opens files close-on-exec).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK = ".lock"


class RunInUse(RuntimeError):
    """Another process (a running run's driver, an export) holds the run directory's lock."""


class RunLock:
    """The held lock of one run directory; ``release`` (or the process's end) lets it go."""

    def __init__(self, run_dir: str | os.PathLike, doing: str = "run"):
        self.path, self._fd = Path(run_dir) / LOCK, None
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunInUse(f"{run_dir} is in use: another process ({holder}) holds {self.path}; a run directory has "
                           f"one driver at a time. Stop that run first (`tidal stop --run {run_dir}`) or wait for "
                           "it to end") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}: {doing}\n".encode(), 0)  # said to whoever is refused
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the one descriptor that holds it releases the lock
            self._fd = None

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()
