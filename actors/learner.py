"""LearnerActor: owns the model, the optimizer and the version counter; publishes versioned weights.

Each batch from replay is one update; after it the version goes up by one and the new weights are
published to every rollout actor of the policy (and the new version to whoever follows it).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch
import trio

from actors.base_model import load_policy
from actors.endpoints import Inbox, Outbox
from actors.training import collate, policy_gradient_step
from actors.weights import weights_to_bytes
from streams.messages import VERSION_TOPIC, WEIGHTS_TOPIC, VersionAnnounced, Weights
from streams.schema import Columns, decode_table
from streams.wire import Kind

log = logging.getLogger(__name__)


@dataclass
class LearnerConfig:
    model_path: str
    policy_id: str = "main"
    lr: float = 5e-4
    clip_eps: float = 0.2
    max_grad_norm: float = 1.0
    kl_coef: float = 0.0  # > 0: penalise KL to the starting policy (a frozen copy)
    temperature: float = 1.0
    threads: int = 1
    announce_every_s: float = 1.0  # re-announce the version, for subscribers that missed one
    save_dir: str | None = None
    seed: int = 0


class LearnerActor:
    def __init__(self, cfg: LearnerConfig, name: str = "learner"):
        self.cfg, self.name = cfg, name
        self.version = 0
        self.history: list[dict] = []  # one entry per update
        self.reference = None  # a frozen copy of the starting policy, when kl_coef > 0
        self._totals = {"batches": 0, "episodes": 0, "tokens": 0, "train_s": 0.0}
        self._inbox = None

    async def run(self, transport, peers: dict, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        model, tokenizer, optimizer = await trio.to_thread.run_sync(self._load)
        policy = self.cfg.policy_id.encode()
        async with (
            transport.open_receiver(capacity=1) as batches,
            transport.open_publisher(capacity=2) as publisher,
        ):
            self._inbox = Inbox(batches, Kind.BATCH, decode_table)
            weights_out = Outbox(publisher, Kind.WEIGHTS, self.name, topic=WEIGHTS_TOPIC + policy)
            versions_out = Outbox(publisher, Kind.VERSION, self.name, topic=VERSION_TOPIC + policy)
            task_status.started({"batches": batches.address, "weights": publisher.address})
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._announce, versions_out)
                    while True:
                        table = await self._inbox.receive()
                        stats = await trio.to_thread.run_sync(self._update, model, optimizer, tokenizer, table)
                        tensors = await trio.to_thread.run_sync(weights_to_bytes, model)
                        await weights_out.send(Weights(self.cfg.policy_id, self.version, tensors).to_body())
                        await versions_out.send(VersionAnnounced(self.cfg.policy_id, self.version).to_body())
                        self.history.append(stats)
            finally:
                if self.cfg.save_dir:
                    with trio.CancelScope(shield=True):
                        await trio.to_thread.run_sync(self._save, model, tokenizer)

    async def _announce(self, versions_out: Outbox) -> None:
        while True:
            await trio.sleep(self.cfg.announce_every_s)
            await versions_out.send(VersionAnnounced(self.cfg.policy_id, self.version).to_body())

    def _load(self):
        torch.set_num_threads(self.cfg.threads)
        torch.manual_seed(self.cfg.seed)
        model, tokenizer = load_policy(self.cfg.model_path)
        self.reference = load_policy(self.cfg.model_path)[0] if self.cfg.kl_coef > 0 else None
        optimizer = torch.optim.AdamW(model.parameters(), lr=self.cfg.lr, weight_decay=0.0)
        return model, tokenizer, optimizer

    def _update(self, model, optimizer, tokenizer, table) -> dict:
        started = time.perf_counter()
        batch = collate(table, tokenizer.pad_token_id)
        stats = policy_gradient_step(model, optimizer, batch, temperature=self.cfg.temperature,
                                     clip_eps=self.cfg.clip_eps, max_grad_norm=self.cfg.max_grad_norm,
                                     reference=self.reference, kl_coef=self.cfg.kl_coef)
        token_versions = batch.versions[batch.action_mask]
        staleness = (self.version - token_versions).float()
        episodes = len(set(table.column(Columns.EPISODE_ID).to_pylist()))
        self.version += 1
        elapsed = time.perf_counter() - started
        self._totals["batches"] += 1
        self._totals["episodes"] += episodes
        self._totals["tokens"] += stats["tokens"]
        self._totals["train_s"] += elapsed
        return {**stats, "version": self.version, "episodes": episodes, "train_s": elapsed,
                "staleness_mean": float(staleness.mean()), "staleness_max": float(staleness.max()),
                "token_version_max": int(token_versions.max()),
                "time": time.time()}

    def _save(self, model, tokenizer) -> None:
        model.save_pretrained(self.cfg.save_dir)
        tokenizer.save_pretrained(self.cfg.save_dir)
        log.info("saved the policy at version %d to %s", self.version, self.cfg.save_dir)

    def statistics(self) -> dict:
        dropped = self._inbox.statistics()["dropped_frames"] if self._inbox else 0
        last = self.history[-1] if self.history else {}
        return {**self._totals, "version": self.version, "last": last, "dropped_frames": dropped}
