"""LearnerActor: owns the model, the optimizer and the version counter; publishes versioned weights.

The model and optimizer are its ``Trainer``'s (``actors/learner/trainer.py``); with ``ranks`` > 1 this actor is
rank 0 of a learner group that trains data-parallel (docs/learner.md), and everything below holds for the group.

Each batch from replay is one update; after it the version goes up by one and the new weights are
published to every rollout actor of the policy (and the new version to whoever follows it). Every
announcement names the learner's ``life``, its start in the run (the driver counts them): a learner restarted
from an older checkpoint announces lower versions in a newer life, and its followers take them
(docs/faults-and-scaling.md, "Learner lives").

Before an update the staleness bound is enforced: a turn with a token more than ``max_staleness`` versions
older than the learner is dropped from the batch and counted (admission control upstream bounds how many
episodes run ahead, not how long one takes, so a slow episode's first turns can fall behind while its later
ones are fresh; with ``max_staleness=0`` every trained token has the learner's version). The bound is the one
each token's version went out with (``StalenessBound``, ``actors/learner/staleness.py``). After an update the
collapse guard (``CollapseGuard``, ``actors/learner/guard.py``) looks at its batch: on a trip it takes the step
and the bound down for a while, and the weights back to an anchor.

Checkpoints: every ``checkpoint_every`` versions and when it stops, the learner writes its policy (a Hugging
Face model directory, loadable with ``from_pretrained``) and, beside it, the optimizer's state (``optimizer/``,
torch.distributed.checkpoint: it loads on any number of ranks) and ``trainer_state.pt``: the version, the random
state, the advantage baselines and its running totals. A learner started with
``resume=True`` and a checkpoint in ``save_dir`` continues from it, at the same version. A checkpoint is
written to a fresh directory and swapped in, so a process killed while writing leaves the previous one.

The data cursor: replay numbers its batches (1, 2, ... in a run's ``data_life``); the learner trains on them in
that order, exactly once, and its checkpoint records the last number it consumed. A batch numbered at or below
the cursor (sent again after a restart) is dropped and counted, and so is one that comes early (after a
restart, before replay's ``rewind`` sends the missing ones in order). A restarted learner thus goes on from its
checkpoint with the batches after it, and with the same random state: it retrains them as before. With a
``dataset_dir`` each trained batch is also written as Parquet, once, by a thread (``actors/learner/dataset.py``).

In a league, ``snapshot(root)`` asks for a frozen snapshot of the policy (``actors/models/snapshots.py``): it is
written between two updates, as ``<root>/<policy_id>-v<version>``, and listed in ``statistics()["snapshots"]``.
``snapshot(root, reset=True)`` (an exploiter's, AlphaStar) then starts the policy again from the base model:
the base weights, a fresh optimizer and fresh advantage baselines, as one more version (the version only goes
up), published like any update and checkpointed at once; ``statistics()["resets"]`` lists the versions.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch
import trio

from actors.models.checkpoints import load_trainer_state
from actors.models.checkpoint_dir import TRAINER_STATE, find_checkpoint, fresh_beside, remove_stale, swap_in
from actors.learner.dataset import EpisodeDataset
from actors.learner.face import LearnerStatistics
from actors.models.devices import DTYPES, check_device, check_dtype
from actors.models.snapshots import snapshot_id
from actors.learner.group import Shard, join_group, open_rendezvous
from actors.learner.guard import CollapseGuard, Guard
from actors.learner.ledger import FORMAT as LEDGER_FORMAT, Ledger, code_fingerprint, combined, ledger_path, weights_digest
from actors.learner.staleness import AutoStaleness, StalenessBound, parse_max_staleness
from actors.learner.trainer import Trainer
from actors.learner.update import Objective
from streams.endpoints import Inbox, Outbox
from streams.weights import WeightsPublisher, weights_to_bytes
from streams.messages import VERSION_TOPIC, WEIGHTS_TOPIC, VersionAnnounced, WeightsFetch
from streams.schema import Columns, decode_batch
from streams.wire import FRAME_LIMITS, Kind

log = logging.getLogger(__name__)


@dataclass
class LearnerConfig:
    model_path: str
    policy_id: str = "main"
    lr: float = 2.5e-4
    lr_decay: str = "constant"  # constant | linear: from lr down to lr * lr_final over the run's budget
    lr_final: float = 0.1
    budget_s: float | None = None  # the run's training budget (wall clock from the first batch), for lr_decay
    budget_versions: int | None = None  # ... or in updates; with both, whichever runs out first
    objective: Objective = field(default_factory=Objective)  # loss, advantages; a dict is accepted
    max_staleness: int | str = 2  # eta: the oldest token a batch may hold is this many versions behind, or "auto"
    staleness: AutoStaleness = field(default_factory=AutoStaleness)  # max_staleness=auto: its limits and moves
    guard: Guard = field(default_factory=Guard)  # the collapse guard (actors/learner/guard.py)
    temperature: float = 1.0
    threads: int = 1
    device: str = "auto"  # auto: CUDA when present, else the CPU; cpu; cuda; cuda:<i>
    dtype: str = "auto"  # what the passes compute in (auto: bf16 on a GPU, fp32 on the CPU; fp16 refused: no loss
    # scaler); parameters, gradients and optimizer state stay fp32
    max_tokens_per_microbatch: int | None = 8192  # padded tokens (rows x longest) a pass takes; None: a minibatch
    activation_checkpointing: bool = False  # recompute each block's activations in the backward pass (less memory)
    ranks: int = 1  # learner processes training the policy data-parallel (FSDP2); this actor is rank 0
    announce_every_s: float = 1.0  # re-announce the version and weights, for late joiners and missed ones
    save_dir: str | None = None  # the checkpoint: the policy and the trainer's state
    checkpoint_every: int = 0  # versions between checkpoints (0: only when the learner stops)
    resume: bool = False  # continue from the checkpoint in save_dir
    data_life: str = ""  # the replay spill's life: a checkpoint's data cursor counts only within the same life
    dataset_dir: str | None = None  # every trained batch as Parquet, by life and policy (actors/learner/dataset.py)
    life: int = 0  # this start of the learner in the run's life (0 the first; the driver counts the restarts)
    seed: int = 0

    def __post_init__(self):
        if isinstance(self.objective, dict):
            self.objective = Objective(**self.objective)
        if isinstance(self.staleness, dict):
            self.staleness = AutoStaleness(**self.staleness)
        if isinstance(self.guard, dict):
            self.guard = Guard(**self.guard)
        parse_max_staleness(self.max_staleness)
        check_device(self.device)
        if DTYPES[check_dtype(self.dtype)] is torch.float16:
            raise ValueError(f"dtype={self.dtype}: the learner does not compute in float16, which needs a loss "
                             "scaler it does not have (its small gradients underflow to zero); use bf16 (a GPU's "
                             "default with dtype=auto) or float32")
        if self.ranks < 1:
            raise ValueError(f"ranks must be >= 1, not {self.ranks}")
        if self.max_tokens_per_microbatch is not None and self.max_tokens_per_microbatch < 1:
            raise ValueError(f"max_tokens_per_microbatch must be >= 1 (or null), not {self.max_tokens_per_microbatch}")
        if self.checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be >= 0, not {self.checkpoint_every}")
        if self.resume and not self.save_dir:
            raise ValueError("resume needs save_dir, the directory of the checkpoint to continue from")
        if self.lr_decay not in ("constant", "linear"):
            raise ValueError(f"unknown lr_decay {self.lr_decay!r}; choose constant or linear")
        if self.lr_decay == "linear" and not (self.budget_s or self.budget_versions):
            raise ValueError("lr_decay=linear needs the run's budget (budget_s or budget_versions) to decay over")
        if not 0.0 <= self.lr_final <= 1.0:
            raise ValueError(f"lr_final is a fraction of lr, in [0, 1], not {self.lr_final}")

    def learning_rate(self, elapsed_s: float, version: int) -> float:
        """The learning rate after ``elapsed_s`` seconds of training and ``version`` updates."""
        if self.lr_decay == "constant":
            return self.lr
        spent = max(elapsed_s / self.budget_s if self.budget_s else 0.0,
                    version / self.budget_versions if self.budget_versions else 0.0)
        return self.lr * (1.0 - (1.0 - self.lr_final) * min(spent, 1.0))


class LearnerActor:
    def __init__(self, cfg: LearnerConfig, name: str = "learner"):
        self.cfg, self.name = cfg, name
        self.version = 0
        self.history: list[dict] = []  # one entry per update
        # rank 0's model, optimizer and objective state (the group's, with ranks > 1)
        self.trainer = Trainer(cfg, Shard(0, cfg.ranks))
        self.guard = CollapseGuard(cfg.guard)
        self.bound = StalenessBound(parse_max_staleness(cfg.max_staleness), cfg.staleness, self.guard)
        self._totals = {"batches": 0, "episodes": 0, "tokens": 0, "train_s": 0.0, "rejected_episodes": 0,
                        "rejected_turns": 0, "rejected_tokens": 0}
        self.cursor = 0  # the number of the last batch consumed (see the module's docstring)
        self._out_of_order = {"duplicate_batches": 0, "early_batches": 0}
        self._staleness = Counter()  # tokens trained on, by staleness, over the whole run
        self._first_batch_at = None
        self._resumed_train_s = 0.0  # training time before a resume, which the busy fraction leaves out
        self._resumed_wall_s = 0.0  # wall time from the first batch before a resume (the lr schedule's clock)
        self._inbox = None
        self._weights = None
        self._streams: dict = {}
        self._snapshot_roots = None  # where snapshots were asked for (a memory channel once running)
        self.snapshots: list[dict] = []  # {"id", "version", "path"} of every snapshot written
        self.resets: list[int] = []  # the versions that started again from the base model
        self.dataset: EpisodeDataset | None = None  # cfg.dataset_dir: each trained batch, written by its thread
        self._checkpoint_cursor: dict = {}  # the cursor of the checkpoint this learner started from
        self.ledger: Ledger | None = None  # with a dataset: what made each version (actors/learner/ledger.py)

    async def run(self, transport, peers: dict, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        checkpoint = self._checkpoint()
        group = {}  # ranks > 1: where the other ranks meet this one; the model loads once they have joined
        if self.cfg.ranks > 1:
            store, group["rendezvous"] = await trio.to_thread.run_sync(open_rendezvous, transport.host, self.cfg.ranks)
        else:
            await trio.to_thread.run_sync(self._load, checkpoint)
        policy = self.cfg.policy_id.encode()
        if self.cfg.dataset_dir:  # less what was trained past the checkpoint: trained again (actors/learner/dataset.py)
            self.dataset = EpisodeDataset.opened(self.cfg, self._checkpoint_cursor,
                                                 lambda ids: self.trainer.tokenizer.batch_decode(ids))
        async with (
            transport.open_receiver(capacity=1) as batches,
            transport.open_publisher(capacity=16) as publisher,
            transport.open_receiver(capacity=64, max_message_bytes=FRAME_LIMITS[Kind.WEIGHTS_FETCH]) as fetches,
        ):
            self._inbox = Inbox(batches, Kind.BATCH, decode_batch)
            self._weights = weights = WeightsPublisher(
                self.name, self.cfg.policy_id, Outbox(publisher, Kind.WEIGHTS, self.name, topic=WEIGHTS_TOPIC + policy),
                fetch_from=fetches.address, life=self.cfg.life,
                fallback=self.cfg.save_dir or tempfile.gettempdir())  # where /dev/shm is too small
            versions_out = Outbox(publisher, Kind.VERSION, self.name, topic=VERSION_TOPIC + policy)
            fetch_inbox = Inbox(fetches, Kind.WEIGHTS_FETCH, WeightsFetch.from_body)
            self._streams = {"batches": self._inbox, "fetch": fetch_inbox, "publisher": versions_out}
            task_status.started({"batches": batches.address, "weights": publisher.address, "fetch": fetches.address,
                                 "version": self.version, "cursor": self.cursor, **group})
            if group:
                await trio.to_thread.run_sync(self._load, checkpoint, store, group["rendezvous"])
            trainer = self.trainer
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._announce, versions_out, weights)
                    nursery.start_soon(weights.serve_chunks, fetch_inbox, transport)
                    # an update, a snapshot and a reset never touch the model at once, and each publishes its
                    # version before the next begins (versions go out in order)
                    model_lock = trio.Lock()
                    self._snapshot_roots, roots = trio.open_memory_channel(16)
                    nursery.start_soon(self._write_snapshots, roots, model_lock, versions_out)
                    self.ledger = self._open_ledger(checkpoint)
                    await self._publish(versions_out, await trio.to_thread.run_sync(
                        self._record, self._start_entry(checkpoint)))
                    while True:
                        table, seq = await self._inbox.receive()
                        if not self._in_order(seq):
                            continue
                        self._first_batch_at = self._first_batch_at or time.perf_counter()
                        self.cursor = seq if seq is not None else self.cursor
                        async with model_lock:  # a reset's version and ledger entry never come in between
                            stats, state = await trio.to_thread.run_sync(self._consume, table, seq)
                            if stats is None:
                                continue
                            await self._publish(versions_out, state)
                            self.history.append(stats)
                            every = self.cfg.checkpoint_every
                            if self.cfg.save_dir and every and self.version % every == 0:
                                await trio.to_thread.run_sync(self._save)
            finally:
                weights.close()
                with trio.CancelScope(shield=True):
                    if self.cfg.save_dir:
                        await trio.to_thread.run_sync(self._save)
                    if self.dataset is not None:
                        await trio.to_thread.run_sync(self.dataset.close)
                    await trio.to_thread.run_sync(trainer.stop_group)

    def snapshot(self, root: str, reset: bool = False) -> None:
        """Ask for a frozen snapshot of the policy under ``root`` (written between two updates); with ``reset``,
        the policy then starts again from the base model."""
        self._snapshot_roots.send_nowait((root, reset))

    async def _publish(self, versions_out: Outbox, state: dict | None = None) -> None:
        """The weights of ``self.version`` to the rollout actors (``state``: already on the CPU, from ``_record``),
        and the version and life to whoever follows."""
        weights = await trio.to_thread.run_sync(lambda: weights_to_bytes(state or self._cpu_state()))
        self.bound.published(self.version)
        await versions_out.send(self._announcement())  # first: followers stop sampling a dead life's weights
        await self._weights.publish(self.version, weights)

    def _cpu_state(self) -> dict:
        return {name: p.detach().cpu().contiguous() for name, p in self.trainer.full_state().items()}

    def _record(self, entry: dict) -> dict | None:
        """``entry`` (what made the weights of ``self.version``) to the ledger, with their digest, in the same
        thread call as the change it records (no cancellation comes between them); the weights on the CPU, for
        ``_publish`` (None: no ledger, and nothing copied yet)."""
        if self.ledger is None:
            return None
        state = self._cpu_state()
        digest = weights_digest(state)
        self.ledger.append({**entry, "digest": digest, "weights": combined(digest)})
        return state

    def _open_ledger(self, checkpoint: Path | None) -> Ledger | None:
        """The ledger beside the dataset, cut back to the checkpoint this learner starts from (no dataset: none)."""
        if not self.cfg.dataset_dir:
            return None
        return Ledger.opened(ledger_path(self.cfg.dataset_dir, self.cfg.policy_id), self.version,
                             self._checkpoint_cursor if checkpoint is not None else {})

    def _start_entry(self, checkpoint: Path | None) -> dict:
        return {"kind": "start", "format": LEDGER_FORMAT, "version": self.version, "life": self.cfg.life,
                "data_life": self.cfg.data_life, "from": "checkpoint" if checkpoint is not None else "base",
                "model_path": self.cfg.model_path, "code": code_fingerprint(), "ranks": self.cfg.ranks,
                "threads": self.cfg.threads, "device": str(self.trainer.device), "dtype": str(self.trainer.dtype),
                "time": time.time()}

    def _announcement(self) -> bytes:
        return VersionAnnounced(self.cfg.policy_id, self.version, self.cfg.life, self.bound.eta).to_body()

    async def _write_snapshots(self, roots, model_lock: trio.Lock, versions_out: Outbox) -> None:
        async for root, reset in roots:
            async with model_lock:
                name = snapshot_id(self.cfg.policy_id, self.version)
                path = Path(root) / name
                if not path.exists():  # asked twice at one version (or before a resume): the first is the snapshot
                    await trio.to_thread.run_sync(self.trainer.snapshot, path)
                    log.info("snapshot %s written to %s", name, path)
                if all(s["id"] != name for s in self.snapshots):
                    self.snapshots.append({"id": name, "version": self.version, "path": str(path)})
                if reset:
                    await self._publish(versions_out, await trio.to_thread.run_sync(self._reset))
                    if self.cfg.save_dir:  # a restart goes on from the reset policy, not from before it
                        await trio.to_thread.run_sync(self._save)

    def _reset(self) -> dict | None:
        """Back to the base model (weights, optimizer, baselines) as the next version: AlphaStar's exploiter reset.
        Episodes sampled before it are older versions: the staleness bound and the off-policy correction see
        them so. Recorded in the ledger (its weights on the CPU returned, as ``_record``'s)."""
        self.trainer.reset()
        self.version += 1
        self.resets.append(self.version)
        log.info("%s reset to the base model %s at version %d", self.name, self.cfg.model_path, self.version)
        return self._record({"kind": "reset", "version": self.version})

    async def _announce(self, versions_out: Outbox, weights: WeightsPublisher) -> None:
        while True:
            await trio.sleep(self.cfg.announce_every_s)
            await versions_out.send(self._announcement())  # the latest manifest follows (its life's)
            await weights.announce_latest()

    def _in_order(self, seq: int | None) -> bool:
        """Is batch ``seq`` the next one? (A batch without a number always is.)"""
        if seq is None or seq == self.cursor + 1:
            return True
        self._out_of_order["duplicate_batches" if seq <= self.cursor else "early_batches"] += 1
        log.info("batch %d dropped: the learner consumed batch %d last", seq, self.cursor)
        return False

    def _checkpoint(self) -> Path | None:
        """The checkpoint to resume from (None: start from the base model); its bookkeeping restored. A half
        checkpoint that a kill or a full disk left beside it is removed first."""
        if self.cfg.save_dir:
            for path in remove_stale(self.cfg.save_dir):
                log.warning("removed %s, a checkpoint written or swapped only in part", path)
        checkpoint = find_checkpoint(self.cfg.save_dir) if self.cfg.resume else None
        if self.cfg.resume and checkpoint is None:
            raise FileNotFoundError(f"resume: no checkpoint in {self.cfg.save_dir} (no {TRAINER_STATE} there)")
        if checkpoint is not None:
            self._restore(load_trainer_state(checkpoint / TRAINER_STATE))
        return checkpoint

    def _load(self, checkpoint: Path | None, store=None, rendezvous: str | None = None) -> None:
        """The model and optimizer, from ``checkpoint`` or the base model (with ranks > 1: once the group met)."""
        if rendezvous is not None:
            join_group(self.trainer.shard, self.trainer.device, rendezvous, store)
        self.trainer.load(checkpoint)
        if checkpoint is not None:
            log.info("resumed from %s at version %d", checkpoint, self.version)

    def _save(self) -> None:
        """Write the policy and the trainer's state to a new directory, then swap it in for the last one."""
        if self.dataset is not None:  # the checkpoint's cursor implies its batches' files
            self.dataset.flush()
        final = Path(self.cfg.save_dir)
        self.trainer.save(fresh_beside(final), {
            "version": self.version, "rng": torch.get_rng_state(), "resets": self.resets, "totals": self._totals,
            "staleness": dict(self._staleness), "cursor": {"life": self.cfg.data_life, "seq": self.cursor},
            "wall_s": self._wall_s(), "staleness_control": {**self.bound.state(), **self.guard.state()}})
        swap_in(final)
        log.info("checkpoint: the policy at version %d in %s", self.version, final)

    def _restore(self, state: dict) -> None:
        """The learner's own bookkeeping from a checkpoint's trainer state (the trainer restores the rest)."""
        torch.set_rng_state(state["rng"])
        self.version = state["version"]
        self.resets = state.get("resets", [])
        self._totals.update(state["totals"])
        self._resumed_train_s = self._totals["train_s"]
        self._resumed_wall_s = state.get("wall_s", 0.0)
        self._staleness.update(state["staleness"])
        self.bound.restore(state.get("staleness_control"))  # one dict, the bound's keys and the guard's
        self.guard.restore(state.get("staleness_control"))
        cursor = self._checkpoint_cursor = state.get("cursor", {})
        self.cursor = cursor["seq"] if cursor.get("life") == self.cfg.data_life else 0  # a new life numbers anew

    def _consume(self, table, seq: int | None) -> tuple[dict | None, dict | None]:
        """Batch ``seq``, next in order: its turns past the staleness bound dropped, the update on the rest, the
        batch to the dataset, the update to the ledger; its statistics and the new weights on the CPU (as
        ``_record``'s). A batch with nothing left is only recorded in the ledger: ``(None, None)``."""
        trained_at = self.version
        table = self._within_bound(table)
        batch = {"life": self.cfg.data_life, "member": self.cfg.policy_id,
                 "seq": seq if seq is not None else trained_at}  # its name in the dataset
        if table is None:
            if self.ledger is not None:
                self.ledger.append({"kind": "dropped_batch", "version": trained_at, "batch": batch,
                                    "dropped": self.bound.dropped})
            return None, None
        dropped = self.bound.dropped
        stats = self._update(table)
        if self.dataset is not None:  # written by the dataset's thread
            self.dataset.add(table, batch["seq"], trained_at)
        return stats, self._record(update_entry(stats, batch, table.num_rows, dropped))

    def _wall_s(self) -> float:
        """Seconds from the first batch, across resumes."""
        since = time.perf_counter() - self._first_batch_at if self._first_batch_at else 0.0
        return self._resumed_wall_s + since

    def _update(self, table) -> dict:
        started = time.perf_counter()
        lr = self.cfg.learning_rate(self._wall_s(), self.version) * self.guard.step_scale
        table, too_long = self.trainer.within_context(table)
        max_version = self.trainer.newest_version(self.version)
        eta, seed = self.bound.eta, self.trainer.update_seed(self.version)
        stats = self.trainer.update(table, lr, self.version, max_version)
        if too_long:
            stats["rejected_rows"] = stats.get("rejected_rows", 0) + too_long
            stats["rejected_by_reason"] = {**stats.get("rejected_by_reason", {}), "too_long": too_long}
        token_versions = torch.tensor(table.column(Columns.POLICY_VERSIONS).combine_chunks().flatten().to_numpy(),
                                      dtype=torch.int64)
        staleness = self.version - token_versions
        histogram = Counter(staleness.tolist())
        tokens = len(token_versions) > 0  # a batch of rows without action tokens (all refused) has none
        self._staleness.update(histogram)
        episodes = len(set(table.column(Columns.EPISODE_ID).to_pylist()))
        self.version += 1
        stats.update(self._react(table, stats))
        elapsed = time.perf_counter() - started
        self._totals["batches"] += 1
        self._totals["episodes"] += episodes
        self._totals["tokens"] += stats["tokens"]
        self._totals["train_s"] += elapsed
        spread = {"staleness_mean": float(staleness.float().mean()), "staleness_max": int(staleness.max()),
                  "token_version_min": int(token_versions.min()), "token_version_max": int(token_versions.max())
                  } if tokens else {}
        return {**stats, "version": self.version, "episodes": episodes, "train_s": elapsed, "lr": lr, **spread,
                "staleness_hist": {str(k): histogram[k] for k in sorted(histogram)}, "time": time.time(),
                "eta_in_force": eta, "seed": seed, "max_version": max_version}

    def _react(self, table, stats: dict) -> dict:
        """After the update that made ``self.version``: the guard's move (a trip, and rollback to its anchor; or a
        new anchor: actors/learner/guard.py), then the bound the version goes out with, which reads the guard's
        cooldown (actors/learner/staleness.py)."""
        invalid = table.column(Columns.INVALID_ACTION).to_numpy(zero_copy_only=False)
        share, ess = (float(invalid.mean()) if len(invalid) else None), stats.get("is_ess")
        guarded = self.guard.observe(self.version, share, ess, len(invalid), eta_floor=self.bound.floor)
        reaction = {"eta": self.bound.observe(ess), "is_ess": ess, **guarded}
        anchored = False
        if reaction["rollback"]:
            self.trainer.restore_anchor()
        elif self.guard.anchor_due(self.version, share, ess, len(invalid)):
            self.trainer.keep_anchor()
            self.guard.anchored(self.version)
            anchored = True
        return {**reaction, "rollback": int(reaction["rollback"]), "anchored": int(anchored), "invalid_share": share,
                "guard_reason": self.guard.last_reason}

    def _within_bound(self, table):
        """The batch without the turns that hold a token past its bound (None: nothing is left), counted."""
        return self.bound.drop_stale(table, self.version, self._totals)

    def statistics(self) -> LearnerStatistics:
        dropped = self._inbox.statistics()["dropped_frames"] if self._inbox else 0
        last = self.history[-1] if self.history else {}
        wall = time.perf_counter() - self._first_batch_at if self._first_batch_at else 0.0
        busy = min((self._totals["train_s"] - self._resumed_train_s) / wall, 1.0) if wall > 0 else 0.0
        return {**self._totals, **self._out_of_order, "version": self.version, "life": self.cfg.life,
                "cursor": self.cursor, "last": last,
                "dropped_frames": dropped, "busy": busy, "snapshots": list(self.snapshots), "resets": list(self.resets),
                "staleness_hist": {str(k): self._staleness[k] for k in sorted(self._staleness)},
                "weights": self._weights.statistics() if self._weights else {},
                "dataset": dict(self.dataset.written) if self.dataset else {},
                "streams": {name: s.statistics() for name, s in self._streams.items()}}


def update_entry(stats: dict, batch: dict, rows: int, dropped: list) -> dict:
    """The ledger's entry for the update that ``stats`` describes (``actors/learner/ledger.py``)."""
    return {"kind": "update", "version": stats["version"], "batch": batch, "rows": rows,
            "dropped": {"turns": len(dropped), "rows": dropped}, "eta": stats["eta_in_force"], "eta_next": stats["eta"],
            "lr": stats["lr"], "seed": stats["seed"], "max_version": stats["max_version"],
            "guard": {"trips": stats["guard_trips"], "rollback": stats["rollback"], "anchored": stats["anchored"],
                      "reason": stats["guard_reason"]},
            "rejected_rows": stats.get("rejected_rows", 0), "train_s": stats["train_s"], "time": stats["time"]}
