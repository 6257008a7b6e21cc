"""The learner group's process group: how ``learner.ranks`` processes meet, shard one model and act as one.

A learner group is ``learner.ranks`` processes that train one policy data-parallel: the model is sharded over
them with FSDP2 (``fully_shard``, one unit per transformer block) on torch.distributed, NCCL on GPUs and gloo on
CPUs. Rank 0 is the ``LearnerActor``: it receives the batches, keeps the version and publishes weights; ranks 1..
(``LearnerRankActor``) follow it. Rank 0 opens a store (``open_rendezvous``) and every rank joins the group there
(``join_group``).

Every ``Trainer`` method marked ``collective`` runs on every rank: on rank 0 it first broadcasts its name and
arguments (a pickled message on the gloo ``control_group``), and the other ranks, waiting in ``Trainer.serve``,
run the same. With one rank nothing is broadcast and nothing is sharded. ``Shard`` is where a rank stands in its
group; its sums and maxima of statistics go through the control group too. A rank whose collective work fails
ends its process (``group_failure``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from dataclasses import dataclass
from datetime import timedelta

import torch

log = logging.getLogger(__name__)

GROUP_TIMEOUT = timedelta(minutes=30)  # a collective that waits longer than this for a rank fails


@dataclass(frozen=True)
class Shard:
    """Rank ``rank`` of ``world`` learner processes training one policy data-parallel (``world=1``: alone)."""

    rank: int = 0
    world: int = 1

    def sum(self, values: list[float]) -> list[float]:
        """``values`` summed element by element over the group's ranks."""
        return self._reduce(values, "SUM")

    def max(self, values: list[float]) -> list[float]:
        """The largest of each of ``values`` over the group's ranks."""
        return self._reduce(values, "MAX")

    def merge(self, weighted: dict[str, float]) -> dict[str, float]:
        """A minibatch's statistics over the group: token-weighted means add up, maxima take the largest."""
        maxima = sorted(k for k in weighted if k.endswith("_max"))
        sums = sorted(k for k in weighted if k not in maxima)
        return {**dict(zip(sums, self.sum([weighted[k] for k in sums]))),
                **dict(zip(maxima, self.max([weighted[k] for k in maxima])))}

    def _reduce(self, values: list[float], op: str) -> list[float]:
        if self.world == 1 or not values:
            return list(values)
        import torch.distributed as dist

        tensor = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op), group=control_group())
        return tensor.tolist()


_CONTROL = {}


def control_group():
    """A gloo group over every rank for small CPU messages (statistics, commands), whatever the training
    backend (NCCL on GPUs): made once per process group."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return None
    if "group" not in _CONTROL:
        _CONTROL["group"] = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else dist.group.WORLD
    return _CONTROL["group"]


def open_rendezvous(host: str, world: int):
    """Rank 0's store, on a free port of ``host``: the other ranks meet there (returns the store, 'host:port')."""
    import torch.distributed as dist

    store = dist.TCPStore(host, 0, world, is_master=True, wait_for_workers=False, timeout=GROUP_TIMEOUT)
    return store, f"{host}:{store.port}"


def join_group(shard: Shard, device: torch.device, rendezvous: str, store=None) -> None:
    """Join the learner group's process group (rank 0 passes the store it opened) on ``device``: on a GPU this
    process's current device becomes it, and NCCL's communicator is bound to it (``device_id``). Without both, a
    rank that sees several GPUs gets ``cuda:0`` wherever torch asks for the current device (FSDP's shards, NCCL's
    collectives) and the group fails with NCCL's "Duplicate GPU detected"."""
    import torch.distributed as dist

    if store is None:
        host, port = rendezvous.rsplit(":", 1)
        store = dist.TCPStore(host, int(port), shard.world, is_master=False, timeout=GROUP_TIMEOUT)
    on_gpu = device.type == "cuda"
    if on_gpu:
        torch.cuda.set_device(device)
    dist.init_process_group(backend="nccl" if on_gpu else "gloo", store=store, rank=shard.rank,
                            world_size=shard.world, timeout=GROUP_TIMEOUT, device_id=device if on_gpu else None)
    control_group()


def on_device(device: torch.device):
    """A block in which ``device`` is the current CUDA device (on the CPU: nothing to do). The current device is
    per thread, and a learner's methods run in whichever worker thread trio gives them: each collective method
    sets it again (``collective``)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def shard_model(model, world: int, device: torch.device, dtype: torch.dtype) -> None:
    """FSDP2 over the group: each transformer block (the model's ``_no_split_modules``) a unit, then the rest.
    ``model`` may be on the CPU: each unit's parameters move to ``device`` as it is sharded, so a rank's GPU
    never holds the whole unsharded model (only one block of it at a time)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (world,))
    precision = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    blocks = set(getattr(model, "_no_split_modules", None) or ())
    for module in list(model.modules()):
        if type(module).__name__ in blocks:
            fully_shard(module, mesh=mesh, mp_policy=precision)
    fully_shard(model, mesh=mesh, mp_policy=precision)


def collective(method):
    """A method every rank runs: rank 0 tells the others first (see the module's docstring), on the rank's device
    (``on_device``). The method's object has a ``shard`` and a ``device``."""

    @functools.wraps(method)
    def run(self, *args):
        if self.shard.world == 1:
            with on_device(self.device):
                return method(self, *args)
        with group_failure(self.shard), on_device(self.device):
            if self.shard.rank == 0:
                import torch.distributed as dist

                dist.broadcast_object_list([(method.__name__, args)], src=0, group=control_group())
            return method(self, *args)

    return run


@contextlib.contextmanager
def group_failure(shard: Shard):
    """A rank whose collective work fails leaves the group in an unknown state (the others may wait in a
    collective it never joins): it ends its process, so that the run sees a dead actor and starts the group again
    from its last checkpoint, instead of a live actor whose loop has stopped."""
    try:
        yield
    except BaseException:
        log.exception("rank %d of %d: the learner group failed; ending this process", shard.rank, shard.world)
        logging.shutdown()
        os._exit(70)
