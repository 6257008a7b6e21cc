"""Handles: the driver calls an actor through the face its kind declares, not by a method's name in a string.

Each actor kind declares what the driver may call on it, as a Protocol beside its class (``actors/<kind>/face.py``:
``EnvFace``, ``LeagueFace``, ``LearnerFace``, ``ReplayFace``, ``RewardFace``, ``RolloutFace``), as RLlib's
``EnvRunner`` declares its face. ``handle(cluster, name, EnvFace)`` is actor ``name`` seen through that face: a
declared method goes to the cluster (``cluster.call``: a Ray actor, or the local loop) with its arguments checked
against the face's signature; any other is refused before it reaches the cluster. An editor follows
``env.evaluate`` to its declaration, and a misspelt method fails where it is written.

``call_unless_dead(env.reissue)`` calls a handle's method, and gives None where the actor died: the next health
check restarts it, and the restart sees to what the call was for.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import ParamSpec, TypeVar, cast

F = TypeVar("F")
P = ParamSpec("P")
R = TypeVar("R")


def handle(cluster, name: str, face: type[F]) -> F:
    """Actor ``name`` on ``cluster``, offering the methods ``face`` declares."""
    return cast(F, ActorHandle(cluster, name, face))


class ActorHandle:
    """One actor, by name, and the methods of its face (see the module): typed as the face by ``handle``."""

    def __init__(self, cluster, name: str, face: type):
        self._cluster, self._name, self._face = cluster, name, face
        self._methods = declared(face)

    def __getattr__(self, method: str) -> ActorMethod:
        if method.startswith("_") or method not in self._methods:
            raise AttributeError(f"{self._name}: {self._face.__name__} declares no {method!r}; the driver may call "
                                 f"{', '.join(sorted(self._methods))}")
        return ActorMethod(self._cluster, self._name, method, self._methods[method])

    def __repr__(self) -> str:
        return f"<{self._face.__name__} {self._name}>"


class ActorMethod:
    """A declared method of one actor: calling it calls the actor (``statistics`` by ``cluster.statistics``, as the
    health check reads them)."""

    def __init__(self, cluster, name: str, method: str, signature: inspect.Signature):
        self.cluster, self.name, self.method, self.signature = cluster, name, method, signature

    def __call__(self, *args, **kwargs):
        bound = self.signature.bind(*args, **kwargs)  # a wrong call fails here, naming what is wrong
        bound.apply_defaults()  # the face's defaults are the actor's (tests/runs/test_handles.py)
        if self.method == "statistics":
            return self.cluster.statistics(self.name)
        return self.cluster.call(self.name, self.method, *bound.args)


@functools.cache
def declared(face: type) -> dict[str, inspect.Signature]:
    """The methods ``face`` declares, by name, each with its signature less ``self`` (positional parameters only:
    ``cluster.call`` passes no keywords)."""
    methods = {}
    for base in reversed(face.__mro__):
        for name, value in vars(base).items():
            if inspect.isfunction(value) and not name.startswith("_"):
                _, *parameters = inspect.signature(value).parameters.values()
                if any(p.kind is not p.POSITIONAL_OR_KEYWORD for p in parameters):
                    raise TypeError(f"{face.__name__}.{name}: a face's method takes positional parameters only")
                methods[name] = inspect.Signature(parameters)
    return methods


def call_unless_dead(method: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R | None:
    """Call a handle's ``method``; if its actor died, None: the next health check restarts it, and the restart
    sees to it."""
    try:
        return method(*args, **kwargs)
    except Exception as error:
        if not cast(ActorMethod, method).cluster.is_dead(error):
            raise
        return None
