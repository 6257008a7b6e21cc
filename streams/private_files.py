"""Files that only this user can read or replace: private directories, files written without following links,
and the sweep that removes what a killed process left behind.

A private directory (`private_dir`) is made with mode 0700 under a shared root such as ``/dev/shm``, named
``tidal-<user>-<pid namespace>-<pid>-<tag>-<random>``: the process that made it owns it, and its name says which
(a directory per writing process, not per run: the writers of a run live in several processes, on several
machines, and each knows only its own pid). `sweep_stale` removes this user's directories whose owner has
died (a SIGKILL runs no cleanup): a directory is removed only if it is a real directory (not a link), owned by
this user, in this pid namespace, and its owner pid is gone. Nothing else in the root is touched.

Files are written with `write_private`: a temporary name nobody can predict, created with
``O_CREAT | O_EXCL | O_NOFOLLOW`` and mode 0600 (a link planted at that name is never followed, an existing
file never reused), then renamed over the final name (a rename replaces a link, it does not write through it).
`check_private` refuses a file or directory that other users may read or write, naming it and the fix.
"""

from __future__ import annotations

import getpass
import os
import re
import secrets
import shutil
import stat
import tempfile
from pathlib import Path

PREFIX = "tidal"
SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else None  # shared memory: where weights go by default
# where private directories of Unix sockets are made (a run's streams, its control endpoint): a short path, as a
# socket's path is at most 107 bytes long
SOCKET_ROOT = SHM_DIR or tempfile.gettempdir()


def user_name() -> str:
    """This user's name as it appears in directory names (letters, digits, ``_.``; else the uid)."""
    try:
        name = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (a container)
        name = ""
    name = re.sub(r"[^A-Za-z0-9_.]", "_", name)[:32]
    return name or str(os.getuid())


def pid_namespace() -> int:
    """This process's pid namespace (pids mean something only within one; 0 where it cannot be told)."""
    try:
        return int(re.sub(r"\D", "", os.readlink("/proc/self/ns/pid")) or 0)
    except OSError:
        return 0


def _owner_prefix() -> str:
    return f"{PREFIX}-{user_name()}-{pid_namespace()}-"


def private_dir(root: str | os.PathLike, tag: str) -> Path:
    """A new directory under ``root``, mode 0700, owned by this process (see the module's docstring)."""
    tag = re.sub(r"[^A-Za-z0-9_.-]", "_", tag)[:48]
    return Path(tempfile.mkdtemp(prefix=f"{_owner_prefix()}{os.getpid()}-{tag}-", dir=root))


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a process of another user has that pid now: not ours to judge, keep it
        return True
    return True


def sweep_stale(root: str | os.PathLike | None) -> list[Path]:
    """Remove this user's private directories under ``root`` whose owner process is gone; the removed ones."""
    if root is None or not os.path.isdir(root):
        return []
    pattern = re.compile(re.escape(_owner_prefix()) + r"(\d+)-")
    removed = []
    for entry in os.scandir(root):
        match = pattern.match(entry.name)
        if match is None or pid_alive(int(match.group(1))):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():  # a link or another user's: left alone
            continue
        shutil.rmtree(entry.path, ignore_errors=True)  # does not follow links inside (rmtree.avoids_symlink_attacks)
        removed.append(Path(entry.path))
    return removed


def remove_private_dir(path: str | os.PathLike | None) -> None:
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)


def write_private(directory: str | os.PathLike, name: str, data) -> Path:
    """Write ``data`` to ``directory/name`` (mode 0600), whole or not at all: readers never see a partial file."""
    directory = Path(directory)
    partial = directory / f".{name}.{secrets.token_hex(8)}.partial"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(memoryview(data).cast("B") if not isinstance(data, str) else data.encode())
        os.rename(partial, directory / name)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return directory / name


def open_private(path: str | os.PathLike) -> int:
    """A read-only descriptor of the regular file ``path`` itself (a link there is refused: OSError). Opened
    without blocking, so that a FIFO planted there is refused at once instead of waiting for a writer."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path} is not a regular file")
    os.set_blocking(fd, True)
    return fd


def make_private_dir(path: str | os.PathLike) -> Path:
    """``path`` as a directory of mode 0700, made if missing (with its parents); an existing one is checked."""
    path = Path(path)
    if not path.exists():
        path.mkdir(mode=0o700, parents=True)
    check_private(path)
    return path


def check_private(path: str | os.PathLike) -> None:
    """Refuse (PermissionError) a file or directory that is a link, is not this user's, or that other users may
    read, write or enter: its mode must be 0600 (a file) or 0700 (a directory), or stricter."""
    path = Path(path)
    info = path.lstat()
    kind = "directory" if stat.S_ISDIR(info.st_mode) else "file"
    if stat.S_ISLNK(info.st_mode):
        raise PermissionError(f"{path} is a symbolic link: give the real path")
    if info.st_uid != os.getuid():
        raise PermissionError(f"{path} belongs to uid {info.st_uid}, not to this user (uid {os.getuid()})")
    if info.st_mode & 0o077:
        mode = "700" if kind == "directory" else "600"
        raise PermissionError(f"{path}: other users may use this {kind} (mode {stat.S_IMODE(info.st_mode):04o}); "
                              f"make it private: chmod {mode} {path}")
