"""What the run writes to its own disk: logs appended line by line that a full disk cannot corrupt, and the one
write error that no restart fixes.

A line-per-record log (replay's batch log, the env actors' ledgers) is appended with `append_line`. A write cut
short (ENOSPC, EDQUOT, a process killed halfway) must not leave a line without its newline: the next append would
continue it, and two records would read as one that does not parse, so the later one (sent, trained) would
vanish from the log. So an append first cuts a file that does not end in a newline back to its last newline (the
cut line was never acknowledged: whoever wrote it learned that its write failed, or died), writes the line, and
on an error cuts the file back to its size before the line.

A full disk (`disk_full`) is not a transient fault: an actor restarted on it fails again, and each restart
spends the run's restart budget. Whoever meets it says so (``actors/runs/host.py``, ``actors/runs/driver.py``).
"""

from __future__ import annotations

import errno
import logging
import os
import re
from pathlib import Path

log = logging.getLogger(__name__)
FULL = (errno.ENOSPC, errno.EDQUOT)  # no space left on the device, or the user's quota is spent
_READ_BACK = 1 << 16  # how much of a file's tail is read at a time, looking for its last newline
_FULL_SIGNS = (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT), "StorageFull", "QuotaExceeded")
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def append_line(path: str | os.PathLike, line: str) -> None:
    """Append ``line`` and a newline to ``path`` (made if missing), whole or not at all (see the module's
    docstring). An error is raised as an OSError naming ``path``."""
    if "\n" in line:
        raise ValueError(f"a log line holds a newline: {line[:80]!r}")
    data = (line + "\n").encode()
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    try:
        size = _cut_partial_line(fd, path)
        written = 0
        try:
            while written < len(data):  # a short write (the disk filled meanwhile) is followed by the error
                written += os.write(fd, data[written:])
        except OSError as error:
            os.ftruncate(fd, size)  # shrinking needs no space
            raise OSError(error.errno, error.strerror, os.fspath(path)) from error
    finally:
        os.close(fd)


def _cut_partial_line(fd: int, path) -> int:
    """Cut the file open at ``fd`` back to just after its last newline, if it does not end in one; its size."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return size
    end = size
    while end > 0:
        start = max(end - _READ_BACK, 0)
        newline = os.pread(fd, end - start, start).rfind(b"\n")
        if newline >= 0:
            end = start + newline + 1
            break
        end = start
    log.warning("%s: a line cut off by a failed write (%d bytes) removed before appending", path, size - end)
    os.ftruncate(fd, end)
    return end


def disk_full(error: BaseException | None) -> OSError | None:
    """The full-disk error (ENOSPC, EDQUOT) behind ``error``, if one is: in it, its exception groups (trio's), or
    the errors it was raised from or during; else None."""
    pending, seen = [error], set()
    while pending:
        e = pending.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in FULL:
            return e
        if any(sign in str(e) for sign in _FULL_SIGNS):  # said only in the message: safetensors' Rust errors,
            return OSError(errno.ENOSPC, f"{type(e).__name__}: {str(e)[:200]}")  # torch's wrapped checkpoint errors
        pending += [*getattr(e, "exceptions", ()), e.__cause__, e.__context__]
    return None


def where_full(error: OSError, default: str | os.PathLike) -> Path:
    """The directory a full-disk ``error`` was met in: its file's directory, else ``default``."""
    return Path(os.fsdecode(error.filename)).parent if error.filename else Path(default)


def name_problem(kind: str, name: str) -> str | None:
    """Why ``name`` may not be used as one part of a path (a policy or member id names directories and files),
    or None: letters, digits and ``_.-`` only, and not ``.`` or ``..``."""
    if not isinstance(name, str) or not _NAME.match(name) or name in (".", ".."):
        return f"{kind} {name!r} is not a name: use letters, digits and _.- only (it names directories)"
    return None
