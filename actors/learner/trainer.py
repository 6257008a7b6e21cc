"""The learner's model, optimizer and objective state on one rank of a learner group.

``Trainer`` is one rank's share of the learner: with one rank, the whole of it. In a group of ``learner.ranks``
processes (``actors/learner/group.py``: how they meet, shard the model and act as one) rank 0's ``Trainer``
belongs to the ``LearnerActor`` and the others' to ``LearnerRankActor``s, waiting in ``serve`` for what rank 0
runs. Each rank gets the whole batch, computes the same advantages (so its ``ObjectiveState`` stays the same as
rank 0's), and trains its share of each minibatch's rows (``actors/learner/microbatches.py``); FSDP sums the
gradients.

A checkpoint is a directory: the policy as a Hugging Face model (rank 0 gathers the full weights), the
optimizer's state written by every rank with torch.distributed.checkpoint (``optimizer/``: it loads on any
number of ranks), and ``trainer_state.pt`` (the version, the data cursor, baselines, counters), all of it read
back as plain data, never unpickled objects (``actors/models/checkpoints.py``).

Precision: the policy's parameters, its gradients and AdamW's moments are fp32 whatever the checkpoint's dtype
(transformers loads a model in the dtype it was saved in: a bf16 checkpoint trained in bf16 would round most
updates away); ``dtype`` (bf16 on a GPU, never fp16: there is no loss scaler) is what the passes compute in:
autocast with one rank, FSDP's mixed precision in a group, the same for the reference model as for the policy
(sharded like it), so that their KL is zero before the first step; log-probs are fp32. The guard's anchors are
kept on the CPU.
"""

from __future__ import annotations

import copy
import logging
import shutil
from pathlib import Path

import torch

from actors.models.base_model import load_policy
from actors.models.checkpoints import FORMAT, load_optimizer, load_trainer_state, plain_state_values, state_values_from_plain
from actors.models.checkpoint_dir import OPTIMIZER_DIR, TRAINER_STATE
from actors.models.devices import resolve_device, resolve_dtype
from actors.models.snapshots import write_snapshot
from actors.learner.batch import collate
from actors.learner.group import Shard, collective, control_group, group_failure, on_device, shard_model
from actors.learner.update import ObjectiveState, policy_gradient_step
from streams.values import check_rows, within_context

log = logging.getLogger(__name__)


class NonFiniteWeights(RuntimeError):
    """The model holds a NaN or infinite parameter: it is not published, snapshotted or checkpointed."""


class Trainer:
    """One rank's share of the learner: ``cfg`` is the learner's ``LearnerConfig``.

    ``update`` trains only on rows that pass ``streams.values.check_rows`` against the model's vocabulary and the
    newest version any life of this learner can have published (``newest_version``; every rank checks the same
    table the same way): nothing out of range reaches the model. The rows it rejects are counted by reason in the
    update's statistics (``rejected_rows``).
    """

    def __init__(self, cfg, shard: Shard = Shard()):
        self.cfg, self.shard = cfg, shard
        self.device = resolve_device(cfg.device, local_rank=shard.rank)
        self.dtype = resolve_dtype(cfg.dtype, self.device)
        self.state = ObjectiveState()
        self.model = self.tokenizer = self.optimizer = self.reference = None
        self._fresh_optimizer = None  # the optimizer's state before any update: what a reset goes back to
        self._anchors: list[dict] = []  # weights a guard's rollback goes back to (actors/learner/staleness.py)

    @collective
    def load(self, checkpoint: Path | None) -> dict | None:
        """The model from ``checkpoint`` (else the base model), sharded over the group, and the optimizer and
        objective state saved with it; returns the checkpoint's ``trainer_state`` (None without one)."""
        torch.set_num_threads(self.cfg.threads)
        torch.manual_seed(self.cfg.seed)
        self.model, self.tokenizer = self._policy(checkpoint or self.cfg.model_path)
        if self.cfg.objective.anchored:  # forward only, computed as the policy is (sharded with it in a group)
            self.reference = self._placed(load_policy(self.cfg.model_path)[0].requires_grad_(False))
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.cfg.lr, weight_decay=0.0)
        self._fresh_optimizer = copy.deepcopy(self.optimizer.state_dict())
        if checkpoint is None:
            return None
        saved = load_trainer_state(checkpoint / TRAINER_STATE)
        if saved.get("optimizer_fresh"):
            pass  # saved before any step since its start or a reset: the fresh optimizer it is
        elif (checkpoint / OPTIMIZER_DIR).exists():
            self._load_optimizer(checkpoint / OPTIMIZER_DIR)
        elif "optimizer" in saved and self.shard.world == 1:  # a checkpoint from before the optimizer moved
            self.optimizer.load_state_dict(saved["optimizer"])
        else:
            raise FileNotFoundError(f"{checkpoint} holds no optimizer state that {self.shard.world} ranks can load")
        self.state = ObjectiveState(role_ids=saved["role_ids"], baselines=saved["baselines"],
                                    state_values=state_values_from_plain(saved.get("state_values")))
        return saved

    def _policy(self, path):
        model, tokenizer = load_policy(path)
        if self.cfg.activation_checkpointing:
            model.gradient_checkpointing_enable()
            model.config.use_cache = False
        return self._placed(model), tokenizer

    def _placed(self, model):
        """``model`` in fp32 (the optimizer's master copy, whatever dtype it was saved in) on this rank's device:
        moved whole with one rank; in a group sharded from the CPU, so that no rank's GPU holds it whole."""
        model.to(torch.float32)
        if self.shard.world > 1:
            shard_model(model, self.shard.world, self.device, self.dtype)
            return model
        return model.to(self.device)

    def _load_optimizer(self, path: Path) -> None:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

        state = {"optimizer": get_optimizer_state_dict(self.model, self.optimizer)}
        load_optimizer(state, path, process_group=control_group())
        set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"])

    def within_context(self, table):
        """``table`` without its rows of more prompt and action tokens than the model's context
        (``max_position_embeddings``), and how many there were: such a row cannot be one sequence of the model,
        and an update's time grows with the square of a row's length (one row of 16 k tokens took 11.7 s on the
        tiny model), so one would stall the learner while it looks alive."""
        context = getattr(self.model.config, "max_position_embeddings", None)
        if context is None:
            return table, 0
        checked = within_context(table, context)
        if checked.rejected:
            log.warning("%d rows of a batch not trained on: longer than the model's context; e.g. %s",
                        checked.rejected_rows, checked.example)
        return checked.table, checked.rejected_rows

    def update(self, table, lr: float, version: int, max_version: int | None | str = "newest") -> dict:
        """One update on ``table``'s usable rows. Rank 0 (or a learner alone) checks them with its own config (a
        restarted group's other ranks keep their first one) and sends the group only what passed. ``max_version``:
        the newest version a token may carry (default: ``newest_version``; a replay gives the recorded one)."""
        max_version = self.newest_version(version) if max_version == "newest" else max_version
        checked = check_rows(table, vocab_size=self.model.get_input_embeddings().num_embeddings,
                             max_version=max_version)
        rejected = {"rejected_rows": checked.rejected_rows, "rejected_by_reason": checked.rejected}
        if checked.rejected:
            log.warning("%d rows of a batch not trained on, by reason %s; e.g. %s", checked.rejected_rows,
                        checked.rejected, checked.example)
        if not checked.table.num_rows:
            return {**rejected, "tokens": 0, "rows": 0, "skipped_steps": 0}  # nothing to step on
        return {**self.train(checked.table, lr, version), **rejected}

    @collective
    def train(self, table, lr: float, version: int) -> dict:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        batch = collate(table, self.tokenizer.pad_token_id)
        # the minibatches' shuffle and row draw, and torch's own generator (dropout, if a model has any): the same
        # on every rank, and again after a resume or in a replay (the seed is the ledger's)
        seed = self.update_seed(version)
        torch.manual_seed(seed)
        generator = torch.Generator().manual_seed(seed)
        compute = self.dtype if self.shard.world == 1 else None  # a sharded model casts by its own policy
        return policy_gradient_step(self.model, self.optimizer, batch, self.cfg.objective, self.state,
                                    temperature=self.cfg.temperature, reference=self.reference, version=version,
                                    generator=generator, max_tokens_per_microbatch=self.cfg.max_tokens_per_microbatch,
                                    shard=self.shard, compute_dtype=compute)

    def update_seed(self, version: int) -> int:
        """The seed of the update that trains at ``version``."""
        return self.cfg.seed * 1_000_003 + version

    def newest_version(self, version: int) -> int | None:
        """The newest policy version a token may carry when this learner is at ``version``: its own in the first
        life of a fresh run; after a restart or a resume, the dead learner may have published up to
        ``checkpoint_every`` versions past the checkpoint this one started from (its tokens are trained, with a
        negative staleness: docs/faults-and-scaling.md); without periodic checkpoints, no bound is known."""
        if self.cfg.life == 0 and not self.cfg.resume:
            return version
        every = self.cfg.checkpoint_every if self.cfg.save_dir else 0
        return version + every if every else None

    @collective
    def full_state(self) -> dict[str, torch.Tensor]:
        """The full weights, on rank 0 (on the CPU for a sharded model; the others get an empty dict); checked
        first: ``NonFiniteWeights`` rather than a NaN published, snapshotted or checkpointed."""
        if self.shard.world == 1:
            return finite({name: p.detach() for name, p in self.model.named_parameters()})
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        names = [name for name, _ in self.model.named_parameters()]  # tied weights once, as with one rank
        return finite({name: full[name] for name in names}) if self.shard.rank == 0 else {}

    @collective
    def save(self, directory: Path, trainer_state: dict) -> None:
        """A checkpoint in ``directory`` (made anew): every rank writes its optimizer shard, rank 0 the rest."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        if self.shard.rank == 0:
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True)
        full = self.full_state.__wrapped__(self)
        if self.shard.world > 1:
            import torch.distributed as dist

            dist.barrier(group=control_group())  # the directory exists before any rank writes into it
        # an optimizer that took no step yet (a reset's, or before the first update) has no state to save; and
        # torch would make one up (a zero step) only where no gradient is left over: so none is saved, and said so
        fresh = not self.optimizer.state
        if not fresh:  # coordinated over the gloo control group: no NCCL collective on whichever device is current
            dcp.save({"optimizer": get_optimizer_state_dict(self.model, self.optimizer)},
                     checkpoint_id=str(directory / OPTIMIZER_DIR), process_group=control_group())
        if self.shard.rank == 0:
            self.model.save_pretrained(directory, state_dict=full)
            self.tokenizer.save_pretrained(directory)
            torch.save({**trainer_state, "format": FORMAT, "optimizer_fresh": fresh, "role_ids": self.state.role_ids,
                        "baselines": self.state.baselines, "state_values": plain_state_values(self.state.state_values)},
                       directory / TRAINER_STATE)

    @collective
    def snapshot(self, path: Path) -> None:
        full = self.full_state.__wrapped__(self)
        if self.shard.rank == 0:
            write_snapshot(self.model, self.tokenizer, path, state_dict=full)

    @collective
    def reset(self) -> None:
        """Back to the base model's weights, a fresh optimizer and fresh baselines."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        base, _ = load_policy(self.cfg.model_path)
        set_model_state_dict(self.model, base.state_dict(), options=StateDictOptions(full_state_dict=True))
        self.optimizer.load_state_dict(self._fresh_optimizer)
        self.state = ObjectiveState()

    @collective
    def keep_anchor(self) -> None:
        """Hold the current weights (each rank its shards) as the newest anchor a guard's rollback returns to;
        two are kept, a rollback takes the older. They are kept on the CPU: two fp32 copies of the weights on the
        GPU would cost twice the parameters' memory."""
        weights = {name: local(value).detach().to("cpu", copy=True) for name, value in self.model.state_dict().items()}
        self._anchors = [*self._anchors, weights][-2:]

    @collective
    def restore_anchor(self) -> None:
        """Back to the older anchor's weights, with a fresh optimizer (its moments belong to the collapse): each
        tensor copied into its place (each rank its shards)."""
        with torch.no_grad():
            for name, value in self.model.state_dict().items():
                local(value).copy_(self._anchors[0][name])
        self.optimizer.load_state_dict(self._fresh_optimizer)
        self._anchors = self._anchors[:1]

    @collective
    def drop_anchors(self) -> None:
        """Hold no anchor, as a learner (re)started from a checkpoint does (a replay of its restart)."""
        self._anchors = []

    def stop_group(self) -> None:
        """Rank 0: let the other ranks' ``serve`` return."""
        if self.shard.world > 1 and self.shard.rank == 0:
            import torch.distributed as dist

            dist.broadcast_object_list([("stop", ())], src=0, group=control_group())

    def serve(self) -> None:
        """Ranks 1..: run what rank 0 runs, until it says stop."""
        import torch.distributed as dist

        while True:
            message = [None]
            with group_failure(self.shard), on_device(self.device):
                dist.broadcast_object_list(message, src=0, group=control_group())
                name, args = message[0]
                if name == "stop":
                    return
                getattr(Trainer, name).__wrapped__(self, *args)


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``tensor``: a sharded tensor's local shard (sharing its storage), else itself."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def finite(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``weights``, if every value is finite; else ``NonFiniteWeights`` naming the first tensor that is not."""
    if not weights:
        return weights
    norms = torch._foreach_norm(list(weights.values()))  # inf or NaN if any element is
    if bool(torch.isfinite(torch.stack([n.float() for n in norms])).all()):
        return weights
    name = next(name for name, n in zip(weights, norms) if not torch.isfinite(n))
    raise NonFiniteWeights(f"parameter {name} holds a NaN or infinite value: these weights are not published")
