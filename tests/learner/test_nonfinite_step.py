"""The learner never takes a non-finite step and never publishes non-finite weights; a batch's unusable rows (a NaN
reward, ragged lists, a token beyond the vocabulary, a version above the learner's) never reach the model.

The review's run: one NaN reward in a batch made every parameter NaN after one update, and then every rollout
died in ``torch.multinomial``; ragged per-token lists crashed ``collate``; an out-of-vocabulary id crashed the
learner's embedding.
"""

import dataclasses
import math
from dataclasses import dataclass

import pytest
import torch

from actors.learner.actor import LearnerConfig
from actors.learner.batch import collate
from actors.learner.group import Shard
from actors.learner.trainer import NonFiniteWeights, Trainer, finite
from actors.learner.update import Objective, ObjectiveState, policy_gradient_step
from streams.schema import Columns as C
from streams.schema import trajectory_table


def row(i: int, **changes) -> dict:
    n = 2 + i % 3
    base = {C.EPISODE_ID: f"env-0-{i // 2}", C.ENV_NAME: "t", C.SEED: 0, C.TURN: i % 2, C.AGENT: i % 2,
            C.MATCHUP: "main,main", C.POLICY_ID: "main", C.PROMPT_IDS: [3 + (i + k) % 20 for k in range(4 + i % 5)],
            C.ACTION_IDS: [5 + (i * k) % 20 for k in range(n)], C.ACTION_TEXT: "", C.BEHAVIOUR_LOGPROBS: [-2.0] * n,
            C.POLICY_VERSIONS: [0] * n, C.REWARD: 1.0 if i % 4 < 2 else -1.0, C.TERMINATED: i % 2 == 1,
            C.TRUNCATED: False, C.EPISODE_RETURN: 1.0 if i % 4 < 2 else -1.0, C.INVALID_ACTION: False,
            C.CREATED_AT: 0.0, C.GENERATED_AT: 0.0, C.SCORED_AT: 0.0}
    return {**base, **changes}


@pytest.fixture(scope="module")
def trainer(tiny_model_dir):
    trainer = Trainer(LearnerConfig(model_path=str(tiny_model_dir), lr=1e-2, device="cpu",
                                    objective=Objective(minibatches=2)))
    trainer.load(None)
    return trainer


def weights(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def moved(before: dict, model) -> bool:
    return any(not torch.equal(before[name], p) for name, p in model.named_parameters())


def test_a_nan_loss_skips_the_step_and_leaves_every_parameter_and_the_optimizer_as_they_were(trainer):
    # collated directly, as before any row check: a NaN reward makes its row's advantage NaN (its role's baseline
    # is not moved by a batch mean outside algos.advantages.BASELINE_RANGE, so the other rows stay finite); the one
    # minibatch that holds it takes no step
    table = trajectory_table([row(i, **({C.REWARD: math.nan} if i == 3 else {})) for i in range(8)])
    batch = collate(table, trainer.tokenizer.pad_token_id)
    optimizer = torch.optim.AdamW(trainer.model.parameters(), lr=1e-2)
    before = weights(trainer.model)
    stats = policy_gradient_step(trainer.model, optimizer, batch, Objective(minibatches=1), ObjectiveState(),
                                 temperature=1.0)
    assert stats["skipped_steps"] == 1
    assert not moved(before, trainer.model) and not optimizer.state  # no step, no moment, no count
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


@dataclass(frozen=True)
class PeerLossWasNaN(Shard):
    """Rank 0 of 2 whose peer's minibatch loss was not finite: the group's maxima say so."""

    def sum(self, values):
        return list(values)

    def max(self, values):
        return [max(v, 1.0) for v in values]


def test_in_a_group_a_peers_non_finite_loss_skips_the_step_here_too(trainer):
    batch = collate(trajectory_table([row(i) for i in range(8)]), trainer.tokenizer.pad_token_id)
    optimizer = torch.optim.AdamW(trainer.model.parameters(), lr=1e-2)
    before = weights(trainer.model)
    stats = policy_gradient_step(trainer.model, optimizer, batch, Objective(minibatches=1), ObjectiveState(),
                                 temperature=1.0, shard=PeerLossWasNaN(0, 2))
    assert stats["skipped_steps"] == 1 and not moved(before, trainer.model)
    stats = policy_gradient_step(trainer.model, optimizer, batch, Objective(minibatches=1), ObjectiveState(),
                                 temperature=1.0)  # alone, with the same rows: finite, and it steps
    assert stats["skipped_steps"] == 0 and moved(before, trainer.model)


def test_an_update_trains_on_the_good_rows_and_counts_the_rest(trainer):
    vocab = trainer.model.get_input_embeddings().num_embeddings
    poison = [row(8, **{C.REWARD: math.nan}), row(9, **{C.BEHAVIOUR_LOGPROBS: [-1.0]}),
              row(10, **{C.ACTION_IDS: [5, 6, vocab]}), row(11, **{C.POLICY_VERSIONS: [0, 0, 0, 4]}),
              row(12, **{C.PROMPT_IDS: [vocab + 7]})]
    assert [len(r[C.ACTION_IDS]) for r in poison] == [4, 2, 3, 4, 2]  # only row 9 is ragged
    table = trajectory_table([row(i) for i in range(8)] + poison)
    before = weights(trainer.model)
    stats = trainer.update(table, 1e-2, 3)  # the learner is at version 3: a token of version 4 is from nowhere
    assert stats["rejected_by_reason"] == {"non_finite": 1, "ragged": 1, "token_id": 2, "version": 1}
    assert stats["rejected_rows"] == 5 and stats["rows"] == 8 and stats["skipped_steps"] == 0
    assert moved(before, trainer.model)
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_after_a_restart_the_dead_lifes_newer_tokens_are_trained_and_nothing_beyond_them(trainer):
    """A learner restarted from its checkpoint (life 1) gets tokens its predecessor sampled up to
    ``checkpoint_every`` versions ahead: they are trained (docs/faults-and-scaling.md), a token beyond is not."""
    first = trainer.cfg
    trainer.cfg = dataclasses.replace(first, life=1, save_dir="/nowhere", checkpoint_every=10)
    try:
        assert trainer.newest_version(3) == 13
        table = trajectory_table([row(i, **{C.POLICY_VERSIONS: [12] * (2 + i % 3)}) for i in range(7)]
                                 + [row(7, **{C.POLICY_VERSIONS: [14] * 3})])
        stats = trainer.update(table, 1e-2, 3)
        assert stats["rejected_by_reason"] == {"version": 1} and stats["rows"] == 7
        trainer.cfg = dataclasses.replace(first, life=1)  # no periodic checkpoints: no bound is known
        assert trainer.newest_version(3) is None
    finally:
        trainer.cfg = first
    assert trainer.newest_version(3) == 3  # a fresh run's first life: the learner's own version


def test_a_batch_with_nothing_usable_is_no_update(trainer):
    before = weights(trainer.model)
    stats = trainer.update(trajectory_table([row(0, **{C.EPISODE_RETURN: math.inf})]), 1e-2, 0)
    assert stats["rejected_rows"] == 1 and stats["tokens"] == 0 and not moved(before, trainer.model)


def test_non_finite_weights_are_never_published(trainer):
    state = trainer.full_state()
    assert state and finite(state) is state
    name, parameter = next(iter(trainer.model.named_parameters()))
    kept = parameter.detach().clone()
    with torch.no_grad():
        parameter.view(-1)[0] = math.inf
    try:
        with pytest.raises(NonFiniteWeights, match=name):
            trainer.full_state()
    finally:
        with torch.no_grad():
            parameter.copy_(kept)
    assert finite(trainer.full_state())
