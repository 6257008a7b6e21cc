"""The learner group's process group: how ``learner.ranks`` processes meet, shard one model and act as one.

A learner group is ``learner.ranks`` processes that train one policy data-parallel: the model is sharded over
them with FSDP2 (``fully_shard``, one unit per transformer block) on torch.distributed, NCCL on GPUs and gloo on
CPUs. Rank 0 is the ``LearnerActor``: it receives the batches, keeps the version and publishes weights; ranks 1..
(``LearnerRankActor``) follow it. Rank 0 opens a store (``open_rendezvous``) and every rank joins the group there
(``join_group``), then proves that it was given the group's secret (``proved_members``).

Every ``Trainer`` method marked ``collective`` runs on every rank: on rank 0 it first broadcasts its name and
arguments (a pickled message on the gloo ``control_group``), and the other ranks, waiting in ``Trainer.serve``,
run the same. With one rank nothing is broadcast and nothing is sharded. ``Shard`` is where a rank stands in its
group; its sums and maxima of statistics go through the control group too. A rank whose collective work fails
ends its process (``group_failure``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import logging
import os
import secrets
import socket
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


def leave_group() -> None:
    """This process out of its learner group (the others must leave too), so that it can start another."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    _CONTROL.clear()


class GroupIntruder(RuntimeError):
    """A process in the learner group's rendezvous could not prove it knows the group's secret."""


def open_rendezvous(host: str, world: int):
    """Rank 0's store, listening on a free port of ``host`` only (torch's own would listen on every interface),
    and the rendezvous the other ranks are given: ``<secret>@<host>:<port>``. The secret is fresh for each start
    of the group and travels only with the rendezvous (through Ray, to each rank's config), never through the
    store, which anyone who reaches the port can read (``proved_members``)."""
    import torch.distributed as dist

    listener = socket.create_server((host, 0))
    port = listener.getsockname()[1]
    store = dist.TCPStore(host, port, world, is_master=True, wait_for_workers=False, timeout=GROUP_TIMEOUT,
                          master_listen_fd=listener.detach())
    return store, f"{secrets.token_hex(16)}@{host}:{port}"


def parse_rendezvous(rendezvous: str) -> tuple[str, str, int]:
    """(secret, host, port) of a rendezvous that `open_rendezvous` made; ValueError naming it otherwise."""
    secret, _, address = rendezvous.rpartition("@")
    host, _, port = address.rpartition(":")
    if not secret or not host or not port.isdigit():
        raise ValueError(f"a learner group's rendezvous is '<secret>@<host>:<port>', not {rendezvous!r}")
    return secret, host, int(port)


def join_group(shard: Shard, device: torch.device, rendezvous: str, store=None) -> None:
    """Join the learner group's process group (rank 0 passes the store it opened) on ``device``, and prove to
    each other that every member is the run's own (`proved_members`) before anything else is sent.

    On a GPU this process's current device becomes ``device``, and NCCL's communicator is bound to it
    (``device_id``). Without both, a rank that sees several GPUs gets ``cuda:0`` wherever torch asks for the
    current device (FSDP's shards, NCCL's collectives) and the group fails with NCCL's "Duplicate GPU detected"."""
    import torch.distributed as dist

    secret, host, port = parse_rendezvous(rendezvous)
    if store is None:
        store = dist.TCPStore(host, port, shard.world, is_master=False, timeout=GROUP_TIMEOUT)
    on_gpu = device.type == "cuda"
    if on_gpu:
        torch.cuda.set_device(device)
    dist.init_process_group(backend="nccl" if on_gpu else "gloo", store=store, rank=shard.rank,
                            world_size=shard.world, timeout=GROUP_TIMEOUT, device_id=device if on_gpu else None)
    proved_members(shard, secret)


def proved_members(shard: Shard, secret: str) -> None:
    """Every rank of the group proves it knows ``secret``, and checks every other rank's proof, with tensors only
    (nothing is unpickled before this passes); `GroupIntruder` otherwise.

    The store cannot keep strangers out: anyone who reaches its port can list and write its keys, and so take a
    rank's place in the group; a rank then receives rank 0's pickled commands and rank 0 unpickles the ranks' plans
    when a checkpoint is written. So each rank draws a nonce, the nonces are gathered, and each rank sends the
    HMAC of them all and its rank under the secret, which only the run's own ranks were given (through Ray): a
    stranger cannot make one, nor replay an old one (the nonces are fresh)."""
    import torch.distributed as dist

    group = control_group()
    nonce = torch.frombuffer(bytearray(os.urandom(16)), dtype=torch.uint8)
    nonces = [torch.empty_like(nonce) for _ in range(shard.world)]
    dist.all_gather(nonces, nonce, group=group)
    challenge = b"".join(bytes(n.tolist()) for n in nonces)

    def proof(rank: int) -> bytes:
        return hmac.new(secret.encode(), challenge + rank.to_bytes(4, "big"), hashlib.sha256).digest()

    mine = torch.frombuffer(bytearray(proof(shard.rank)), dtype=torch.uint8)
    proofs = [torch.empty_like(mine) for _ in range(shard.world)]
    dist.all_gather(proofs, mine, group=group)
    strangers = [rank for rank, given in enumerate(proofs) if not hmac.compare_digest(bytes(given.tolist()),
                                                                                       proof(rank))]
    if strangers:
        raise GroupIntruder(f"rank {shard.rank} of the learner group: rank(s) {strangers} did not prove they know the "
                            "group's secret: a process that is not the run's own joined its rendezvous")


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
