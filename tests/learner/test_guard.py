"""The collapse guard on a real learner: a forced collapse is detected, counted, and rolled back to an anchor."""

from types import SimpleNamespace

import torch

from actors.learner.actor import LearnerActor, LearnerConfig
from streams.schema import Columns, trajectory_table
from tests.factories import sampled_row as row


def batch(version: int, invalid: bool):
    sampled = SimpleNamespace(tokens=[7, 8, 9], logprobs=[-1.0, -1.2, -0.8])
    rows = []
    for i in range(8):
        r = row([5, 6, 11, 12], sampled, version=version, seat=i % 2, ret=-1.0 if invalid or i % 3 else 1.0,
                episode=f"v{version}-{i}")
        r[Columns.INVALID_ACTION] = invalid
        rows.append(r)
    return trajectory_table(rows)


def weights(learner: LearnerActor) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in learner.trainer.model.state_dict().items()}


def test_a_forced_collapse_is_detected_counted_and_rolled_back_to_the_anchor(tiny_model_dir):
    cfg = LearnerConfig(model_path=str(tiny_model_dir), max_staleness=2, lr=1e-3,
                        guard={"patience": 2, "cooldown": 5, "anchor_every": 3, "ess_floor": 0.0})
    learner = LearnerActor(cfg)
    learner._load(None)
    held = {}
    for _ in range(6):  # healthy updates: anchors at versions 3 and 6
        stats = learner._update(batch(learner.version, invalid=False))
        held[learner.version] = weights(learner)
        assert stats["guard_trips"] == 0 and stats["invalid_share"] == 0.0 and stats["eta"] == 2
    assert learner.guard.anchors == [3, 6]
    suspicious = learner._update(batch(learner.version, invalid=True))  # version 7: one batch is not yet a trip
    assert suspicious["guard_trips"] == 0 and not suspicious["rollback"]
    tripped = learner._update(batch(learner.version, invalid=True))  # version 8
    assert tripped["guard_trips"] == 1 and tripped["rollback"] == 1 and tripped["eta"] == 1
    now = weights(learner)
    assert all(torch.equal(now[k], held[3][k]) for k in now)  # the older anchor's weights, as version 8
    assert not learner.trainer.optimizer.state  # a fresh optimizer
    after = learner._update(batch(learner.version, invalid=False))
    assert after["lr"] == 1e-3 * 0.5 and after["step_scale"] == 0.5 and after["eta"] == 0
    assert learner.guard.state()["trips"] == 1
