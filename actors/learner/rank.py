"""LearnerRankActor: rank 1.. of a learner group (``learner.ranks`` > 1). Rank 0 is the ``LearnerActor``.

It has no streams: it joins the group's process group at rank 0's rendezvous and then runs what rank 0 tells
it (``Trainer.serve``): load the model (its shard) and optimizer, train its share of each batch, take part in
gathering the weights, writing checkpoints and snapshots. If any rank dies the group is started again as a
whole, from the last checkpoint (``actors/runs/recovery.py``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import trio

from actors.learner.actor import LearnerConfig
from actors.learner.group import Shard, group_failure, join_group
from actors.learner.trainer import Trainer

log = logging.getLogger(__name__)


@dataclass
class RankConfig:
    learner: LearnerConfig  # the group's learner config (rank 0's)
    rank: int
    rendezvous: str = field(repr=False)  # rank 0's store, '<secret>@<host>:<port>' (actors/learner/group.py)

    def __post_init__(self):
        if isinstance(self.learner, dict):
            self.learner = LearnerConfig(**self.learner)
        if not 1 <= self.rank < self.learner.ranks:
            raise ValueError(f"rank {self.rank} is outside the group of {self.learner.ranks} (ranks 1.. follow rank 0)")


class LearnerRankActor:
    def __init__(self, cfg: RankConfig, name: str = "learner-rank1"):
        self.cfg, self.name = cfg, name
        self.trainer = Trainer(cfg.learner, Shard(cfg.rank, cfg.learner.ranks))
        self.state = "starting"

    async def run(self, transport, peers: dict, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started({})  # rank 0 waits for this rank in its own start, after the spawn returns
        await trio.to_thread.run_sync(self._serve, abandon_on_cancel=True)

    def _serve(self) -> None:
        with group_failure(self.trainer.shard):  # rank 0 gone before the group met: this process ends too
            join_group(self.trainer.shard, self.trainer.device, self.cfg.rendezvous)
        self.state = "serving"
        self.trainer.serve()
        self.state = "stopped"
        log.info("%s: rank 0 ended the group", self.name)

    def statistics(self) -> dict:
        return {"rank": self.cfg.rank, "ranks": self.cfg.learner.ranks, "state": self.state,
                "device": str(self.trainer.device)}
