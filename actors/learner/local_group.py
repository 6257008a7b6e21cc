"""A learner group in local processes, without Ray or streams: the same ``Trainer`` ranks on given batches.

For measuring and checking the group (``benchmarks/learner_scale.py``, the tests): ``train`` starts ``world``
processes, meets them at a store this process opens, has rank 0 load, train on ``tables`` in order (as versions
0, 1, ...), optionally save a checkpoint, and returns the full weights and each rank's memory.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import tempfile
import time
from pathlib import Path

import torch

from actors.learner.group import Shard, join_group, open_rendezvous
from actors.learner.trainer import Trainer, local


def local_bytes(tensors) -> int:
    """Bytes of this rank's part of ``tensors`` (a sharded tensor's local shard)."""
    total = 0
    for t in tensors:
        if t is None:
            continue
        t = local(t)
        total += t.numel() * t.element_size()
    return total


def memory(trainer: Trainer) -> dict:
    params = list(trainer.model.parameters())
    state = [v for s in trainer.optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)
             and v.dim() > 0]
    return {"param_bytes": local_bytes(params), "grad_bytes": local_bytes(p.grad for p in params),
            "optimizer_bytes": local_bytes(state)}


def _rank(rank: int, world: int, rendezvous: str | None, cfg, tables, lrs, checkpoint, save_to, out: str,
          first: int, save_after: int, anchor_after: int | None = None) -> None:
    trainer = Trainer(cfg, Shard(rank, world))
    if world > 1:
        join_group(trainer.shard, trainer.device, rendezvous)
    result = {}
    if rank == 0:
        trainer.load(checkpoint)
        stats, started = [], time.perf_counter()
        for version, (table, lr) in enumerate(zip(tables, lrs)):
            if version >= first:
                stats.append(trainer.update(table, lr, version))
            if save_to is not None and version + 1 == save_after:
                trainer.save(Path(save_to), {"version": save_after})
            if version + 1 == anchor_after:
                trainer.keep_anchor()
        if anchor_after is not None:  # the guard's rollback: back to the anchor's weights
            trainer.restore_anchor()
        result["train_s"] = time.perf_counter() - started
        result["stats"] = stats
        result["weights"] = {k: v.detach().cpu().clone() for k, v in trainer.full_state().items()}
        result["optimizer_steps"] = _steps(trainer)
        trainer.stop_group()
    else:
        trainer.serve()
    result["memory"] = memory(trainer)
    torch.save(result, f"{out}/rank{rank}.pt")
    if world > 1:
        import torch.distributed as dist

        dist.destroy_process_group()


def _steps(trainer: Trainer) -> int:
    steps = [s.get("step") for s in trainer.optimizer.state.values()]
    return int(max((float(s) for s in steps if s is not None), default=0))


def train(cfg, world: int, tables: list, lrs: list[float] | None = None, checkpoint: str | Path | None = None,
          save_to: str | Path | None = None, timeout_s: float = 600.0, resume_versions: int = 0,
          save_after: int | None = None, anchor_after: int | None = None) -> dict:
    """Train ``tables`` on ``world`` ranks in processes; rank 0's result and every rank's ``memory``. With a
    ``checkpoint`` made after ``resume_versions`` updates, the tables from that version on. ``save_to``: a
    checkpoint there after ``save_after`` updates (default: all of them). ``anchor_after``: the weights after that
    many updates are held as the guard's anchor and restored after the last (the result's weights are the
    anchor's)."""
    cfg = dataclasses.replace(cfg, ranks=world)
    lrs = lrs or [cfg.lr] * len(tables)
    rendezvous = store = None
    if world > 1:
        store, rendezvous = open_rendezvous("127.0.0.1", world)
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="tidal-group-") as out:
        ranks = [context.Process(target=_rank, args=(r, world, rendezvous, cfg, tables, lrs,
                                                     None if checkpoint is None else Path(checkpoint),
                                                     save_to, out, resume_versions,
                                                     len(tables) if save_after is None else save_after,
                                                     anchor_after))
                 for r in range(world)]
        for process in ranks:
            process.start()
        for process in ranks:
            process.join(timeout_s)
        failed = [(r, p.exitcode) for r, p in enumerate(ranks) if p.exitcode != 0]
        for process in ranks:
            if process.is_alive():
                process.kill()
        if failed:
            raise RuntimeError(f"learner ranks failed (rank, exit code): {failed}")
        results = [torch.load(f"{out}/rank{r}.pt", weights_only=False) for r in range(world)]
    del store
    return {**results[0], "memory": [r["memory"] for r in results]}
