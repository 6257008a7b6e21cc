"""Hosting actors: each actor's trio loop in a thread of its own process, or all on one shared loop.

``ActorHost`` is what the launcher wraps with ``ray.remote``: it builds one actor in the Ray worker
process, runs its loop in a thread (``trio.run``) over ZeroMQ, and answers control calls by running them
on that loop. ``LocalCluster`` is the in-process mode: every actor on one trio loop, wired with in-memory
channels (or ZeroMQ sockets, for tests of the real data plane without Ray).

A loop that raises is a crashed actor: an ``ActorHost`` logs the traceback and ends its process (status
``LOOP_CRASH_EXIT``), so Ray reports a dead actor and the run restarts it as after a kill; in a ``LocalCluster``
the error, naming the actor, ends the run (one process cannot restart one actor).

A loop that met a full disk (ENOSPC, EDQUOT: ``streams.disk.disk_full``) is different: a restart would meet
the same disk, spending the run's restart budget for nothing. Its process is kept, its loop stopped, and every
call to it raises ``DiskFull`` (the actor, the directory, the error): a dead process's cause cannot reach the
driver (Ray says only that it died), a raised error does, and the driver ends the run at once with what to free
(``actors/runs/driver.py``).
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import socket
import threading
import time

import trio

from streams.channels import MemoryTransport, ZmqTransport
from streams.disk import disk_full, where_full
from streams.private_files import SOCKET_ROOT, private_dir, remove_private_dir
from streams.security import CurveKeys

log = logging.getLogger(__name__)
# how long a stopping loop may take: a learner finishes the update under way and writes its last checkpoint
# (minutes for a model of real size on a CPU); a loop cut off earlier would lose them
STOP_TIMEOUT_S = 600.0
# ``call(name, CRASH, reason)``: raise inside the actor's running trio loop, as a bug would (benchmarks/chaos.py).
# A dunder name: no actor defines it, and no stream carries method names.
CRASH = "__crash__"
LOOP_CRASH_EXIT = 71  # the exit status of an actor's process whose loop raised (a learner group's failure: 70)


class ActorCrashed(RuntimeError):
    """An actor's trio loop raised. In a process of its own the process ends (Ray then reports a dead actor, and
    the run restarts it); in one process with the others (``LocalCluster``) it ends the run, naming the actor."""


class DiskFull(ActorCrashed):
    """An actor's loop met a full disk under ``path``: not a fault a restart fixes (see the module's docstring)."""

    def __init__(self, actor: str, path: str, detail: str):
        super().__init__(actor, path, detail)  # its arguments: it is pickled on its way to the driver
        self.actor, self.path, self.detail = actor, path, detail

    def __str__(self) -> str:
        who = "the driver" if self.actor == "driver" else f"the {self.actor} actor"
        return f"{who} found its disk full{f' under {self.path}' if self.path else ''} ({self.detail})"


def full_disk_error(error: BaseException | None, actor: str) -> DiskFull | None:
    """The ``DiskFull`` that ``error`` is, holds or stands for (a full-disk OSError behind it), else None."""
    pending, seen = [error], set()
    while pending:  # Ray's RayTaskError holds the actor's error as ``cause``
        e = pending.pop()
        for found in (getattr(e, "cause", None), e):  # the actor's own first: Ray's wrapper says only where
            if isinstance(found, DiskFull):
                return found
        if e is not None and id(e) not in seen:
            seen.add(id(e))
            pending += [*getattr(e, "exceptions", ()), getattr(e, "cause", None), e.__cause__]
    full = disk_full(error)
    if full is None:
        return None
    where = str(where_full(full, "")) if full.filename else ""  # "": unknown (the driver names the run's)
    return DiskFull(actor, where, f"{full.strerror or full}: {full.filename or 'a write'}")


class _LoopThread:
    """A trio loop in a daemon thread, with a nursery other threads can start tasks in.

    ``on_crash(error)``: called (after the traceback is logged) when the loop ends with an error while not
    stopping; an ``ActorHost`` ends its process there."""

    def __init__(self, name: str, on_crash=None):
        self._ready = threading.Event()
        self._thread = threading.Thread(target=trio.run, args=(self._main,), name=name, daemon=True)
        self._error: BaseException | None = None
        self._on_crash, self._stopping = on_crash, False
        self._thread.start()
        self._ready.wait()

    async def _main(self) -> None:
        self.token = trio.lowlevel.current_trio_token()
        try:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                self._ready.set()
                await trio.sleep_forever()
        except BaseException as error:  # surface a crashed actor to the caller of the next call (logged once, here)
            self._error = error
            log.exception("actor loop %s ended with an error", self._thread.name)
            if self._on_crash is not None and not self._stopping:
                self._on_crash(error)
        finally:
            self._ready.set()

    def start(self, async_fn, *args):
        """Start ``async_fn`` in the loop's nursery; returns what it passes to ``task_status.started``."""
        return trio.from_thread.run(self.nursery.start, async_fn, *args, trio_token=self.token)

    def call(self, fn, *args):
        if self._error is None:
            try:
                return trio.from_thread.run_sync(fn, *args, trio_token=self.token)
            except trio.RunFinishedError:  # the loop has ended: with an error?
                self._thread.join(5.0)
                if self._error is None:
                    raise
        full = full_disk_error(self._error, self._thread.name)
        if full is not None:
            raise full from self._error
        raise ActorCrashed(f"{crash_description(self._error)} (its traceback is logged); the actor loop has "
                           "stopped") from self._error

    def crash(self, name: str, reason: str = "a crash asked for") -> None:
        """Raise ``ActorCrashed`` inside the loop, as a task of it (``CRASH``)."""

        async def crash():
            raise ActorCrashed(f"the {name} actor's loop raised: {reason}")

        trio.from_thread.run_sync(self.nursery.start_soon, crash, trio_token=self.token)

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        self._stopping = True
        try:
            trio.from_thread.run_sync(self.nursery.cancel_scope.cancel, trio_token=self.token)
        except trio.RunFinishedError:
            pass
        self._thread.join(min(timeout, 5.0))
        if self._thread.is_alive():
            log.info("%s: waiting for its loop to end (a learner finishes its update and writes its checkpoint)",
                     self._thread.name)
            self._thread.join(max(timeout - 5.0, 0.0))


def crash_description(error: BaseException) -> str:
    """What ended a loop: the ``ActorCrashed`` inside ``error`` (maybe in an exception group, as trio raises),
    else ``error`` itself."""
    found, pending = None, [error]
    while pending and found is None:
        e = pending.pop(0)
        found = e if isinstance(e, ActorCrashed) else None
        pending += list(getattr(e, "exceptions", ()))
    return str(found) if found is not None else f"an actor's loop raised {error!r}"


def _end_process(name: str):
    def end(error: BaseException) -> None:
        full = full_disk_error(error, name)
        if full is not None:  # a restart would meet the same disk: the process stays, and says why when called
            log.critical("%s: %s; the process stays with its loop stopped, so that the run hears why and ends "
                         "(a restart would meet the same disk)", name, full)
            return
        log.critical("%s: its loop raised (traceback above); ending its process with status %d, so that the run "
                     "sees a dead actor and restarts it", name, LOOP_CRASH_EXIT)
        logging.shutdown()
        os._exit(LOOP_CRASH_EXIT)

    return end


async def _named(name: str, run, transport, peers: dict, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """An actor's ``run``, whose error names the actor (one loop holds every actor: ``LocalCluster``)."""
    try:
        await run(transport, peers, task_status=task_status)
    except Exception as error:
        leaf = error
        while getattr(leaf, "exceptions", None):  # trio's exception groups: what was raised
            leaf = leaf.exceptions[0]
        full = full_disk_error(error, name)
        if full is not None:
            raise full from error
        raise ActorCrashed(f"the {name} actor's loop raised {type(leaf).__name__}: {leaf}") from error


class ActorHost:
    """One actor in this process, its loop in a thread, its streams on ZeroMQ. Ray wraps this class."""

    def __init__(self, actor_cls, cfg, name: str, host: str = "127.0.0.1", curve_dir: str | None = None,
                 rebind: list[str] = (), ipc_dir: str | None = None):
        logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {name} %(levelname)s %(message)s")
        # SIGUSR1 writes every thread's stack to the log: what the driver asks of an actor that stopped answering
        faulthandler.register(signal.SIGUSR1, all_threads=True, chain=True)
        self.actor = actor_cls(cfg, name=name)
        self.transport = ZmqTransport(host=host, curve=CurveKeys.load(curve_dir) if curve_dir else None,
                                      rebind=rebind, ipc_dir=ipc_dir)
        self._loop = _LoopThread(name, on_crash=_end_process(name))
        self.name = name

    def start(self, peers: dict) -> dict:
        """Bind, connect to ``peers`` and start serving; returns this actor's addresses."""
        return self._loop.start(self.actor.run, self.transport, peers)

    def bound(self) -> list[str]:
        """The addresses this actor bound, in order: a restarted one binds them again (``rebind``)."""
        return list(self.transport.bound)

    def call(self, method: str, *args):
        if method == CRASH:
            return self._loop.crash(self.name, *args)
        return self._loop.call(getattr(self.actor, method), *args)

    def statistics(self) -> dict:
        return self._loop.call(self.actor.statistics)

    def ping(self) -> float:
        """Answered on the actor's loop, at once: the health check's sign that the loop runs (its statistics may
        take longer; a learner's update runs in a worker thread and does not hold the loop)."""
        return self._loop.call(time.monotonic)

    def pid(self) -> int:
        return os.getpid()

    def where(self) -> dict:
        """This process's pid and host: where the driver sends a silent actor's SIGUSR1 (its stacks)."""
        return {"pid": os.getpid(), "host": socket.gethostname()}

    def stop(self) -> None:
        self._loop.stop()


class LocalCluster:
    """The in-process mode: every actor on one trio loop. ``transport="zmq"`` keeps real sockets: Unix sockets in a
    private directory (``ipc_dir``), removed at `shutdown`."""

    def __init__(self, transport: str = "memory"):
        self.ipc_dir = None if transport == "memory" else private_dir(SOCKET_ROOT, "streams")
        self.transport = MemoryTransport() if transport == "memory" else ZmqTransport(ipc_dir=self.ipc_dir)
        self.actors: dict[str, object] = {}
        self._loop = _LoopThread("tidal-local")

    def spawn(self, name: str, actor_cls, cfg, peers: dict) -> dict:
        actor = self.actors[name] = actor_cls(cfg, name=name)
        return self._loop.start(_named, name, actor.run, self.transport, peers)

    def spawn_many(self, actors: list[tuple]) -> list[dict]:
        return [self.spawn(*actor) for actor in actors]

    def reserve_group(self, names: list[str], device: str = "auto") -> None:
        if len(names) > 1:  # config.check refuses it before: one process cannot hold several ranks
            raise ValueError("a learner group of several ranks needs run.mode=ray")

    def call(self, name: str, method: str, *args):
        """``method`` of actor ``name``, on the loop. An actor's crash ended the loop: ``ActorCrashed``, naming it
        (one process cannot restart an actor: the run ends; ``run.mode=ray`` restarts it)."""
        if method == CRASH:
            return self._loop.crash(name, *args)
        try:
            return self._loop.call(getattr(self.actors[name], method), *args)
        except DiskFull:  # the run ends for it in any mode, saying what to free
            raise
        except ActorCrashed as error:
            raise ActorCrashed(f"{error}. run.mode=local runs every actor in this one process, which cannot restart "
                               "one: the run ends (run.mode=ray restarts a crashed actor)") from error.__cause__

    def statistics(self, name: str) -> dict:
        return self.call(name, "statistics")

    def is_dead(self, error: Exception) -> bool:  # one process: an actor cannot die alone
        return False

    def stop(self, name: str) -> None:
        raise NotImplementedError("run.mode=local cannot remove an actor from a running run: scale in run.mode=ray")

    def set_peers(self, name: str, key: str, addresses: list[str], member: str | None = None) -> None:
        pass  # nothing is restarted in one process

    def reconfigure(self, name: str, **changes) -> None:
        pass  # nor rebalanced

    def shutdown(self) -> None:
        self._loop.stop()
        remove_private_dir(self.ipc_dir)
