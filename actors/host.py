"""Hosting actors: each actor's trio loop in a thread of its own process, or all on one shared loop.

``ActorHost`` is what the launcher wraps with ``ray.remote``: it builds one actor in the Ray worker
process, runs its loop in a thread (``trio.run``) over ZeroMQ, and answers control calls by running them
on that loop. ``LocalCluster`` is the in-process mode: every actor on one trio loop, wired with in-memory
channels (or ZeroMQ sockets, for tests of the real data plane without Ray).
"""

from __future__ import annotations

import logging
import os
import threading

import trio

from streams.channels import MemoryTransport, ZmqTransport
from streams.security import CurveKeys

log = logging.getLogger(__name__)
# how long a stopping loop may take: a learner finishes the update under way and writes its last checkpoint
# (minutes for a model of real size on a CPU); a loop cut off earlier would lose them
STOP_TIMEOUT_S = 600.0


class _LoopThread:
    """A trio loop in a daemon thread, with a nursery other threads can start tasks in."""

    def __init__(self, name: str):
        self._ready = threading.Event()
        self._thread = threading.Thread(target=trio.run, args=(self._main,), name=name, daemon=True)
        self._error: BaseException | None = None
        self._thread.start()
        self._ready.wait()

    async def _main(self) -> None:
        self.token = trio.lowlevel.current_trio_token()
        try:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                self._ready.set()
                await trio.sleep_forever()
        except BaseException as error:  # surface a crashed actor to the caller of the next call
            self._error = error
            log.exception("actor loop %s ended with an error", self._thread.name)
            raise
        finally:
            self._ready.set()

    def start(self, async_fn, *args):
        """Start ``async_fn`` in the loop's nursery; returns what it passes to ``task_status.started``."""
        return trio.from_thread.run(self.nursery.start, async_fn, *args, trio_token=self.token)

    def call(self, fn, *args):
        if self._error is not None:
            raise RuntimeError(f"the actor loop has stopped: {self._error!r}") from self._error
        return trio.from_thread.run_sync(fn, *args, trio_token=self.token)

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        try:
            trio.from_thread.run_sync(self.nursery.cancel_scope.cancel, trio_token=self.token)
        except trio.RunFinishedError:
            pass
        self._thread.join(min(timeout, 5.0))
        if self._thread.is_alive():
            log.info("%s: waiting for its loop to end (a learner finishes its update and writes its checkpoint)",
                     self._thread.name)
            self._thread.join(max(timeout - 5.0, 0.0))


class ActorHost:
    """One actor in this process, its loop in a thread, its streams on ZeroMQ. Ray wraps this class."""

    def __init__(self, actor_cls, cfg, name: str, host: str = "127.0.0.1", curve_dir: str | None = None,
                 rebind: list[str] = ()):
        logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {name} %(levelname)s %(message)s")
        self.actor = actor_cls(cfg, name=name)
        self.transport = ZmqTransport(host=host, curve=CurveKeys.load(curve_dir) if curve_dir else None,
                                      rebind=rebind)
        self._loop = _LoopThread(name)

    def start(self, peers: dict) -> dict:
        """Bind, connect to ``peers`` and start serving; returns this actor's addresses."""
        return self._loop.start(self.actor.run, self.transport, peers)

    def bound(self) -> list[str]:
        """The addresses this actor bound, in order: a restarted one binds them again (``rebind``)."""
        return list(self.transport.bound)

    def call(self, method: str, *args):
        return self._loop.call(getattr(self.actor, method), *args)

    def statistics(self) -> dict:
        return self._loop.call(self.actor.statistics)

    def pid(self) -> int:
        return os.getpid()

    def stop(self) -> None:
        self._loop.stop()


class LocalCluster:
    """The in-process mode: every actor on one trio loop. ``transport="zmq"`` keeps real sockets."""

    def __init__(self, transport: str = "memory"):
        self.transport = MemoryTransport() if transport == "memory" else ZmqTransport()
        self.actors: dict[str, object] = {}
        self._loop = _LoopThread("tidal-local")

    def spawn(self, name: str, actor_cls, cfg, peers: dict) -> dict:
        actor = self.actors[name] = actor_cls(cfg, name=name)
        return self._loop.start(actor.run, self.transport, peers)

    def spawn_many(self, actors: list[tuple]) -> list[dict]:
        return [self.spawn(*actor) for actor in actors]

    def reserve_group(self, names: list[str], device: str = "auto") -> None:
        if len(names) > 1:  # config.check refuses it before: one process cannot hold several ranks
            raise ValueError("a learner group of several ranks needs run.mode=ray")

    def call(self, name: str, method: str, *args):
        return self._loop.call(getattr(self.actors[name], method), *args)

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
