"""Micro-batches cut by a token budget: the plan, and an update that does not depend on the cut."""

import copy
import random
from types import SimpleNamespace

import pytest
import torch

from actors.learner import microbatches
from actors.models import padding
from actors.learner.microbatches import trained_rows
from actors.learner.batch import single_turn_batch
from actors.learner.update import Objective, ObjectiveState, policy_gradient_step


def test_a_cut_keeps_every_row_once_and_stays_within_the_budget():
    rng = random.Random(0)
    lengths = [rng.randint(3, 40) for _ in range(57)]
    for world in (1, 2, 3):
        shares = microbatches.plan(lengths, budget=96, world=world)
        assert len(shares) == world
        assert len({len(share) for share in shares}) == 1  # the ranks' passes pair up
        rows = sorted(r for share in shares for batch in share for r in batch)
        assert rows == list(range(len(lengths)))
        for share in shares:
            for batch in share:
                if len(batch) > 1:
                    assert len(batch) * max(lengths[r] for r in batch) <= 96


def test_a_row_longer_than_the_budget_is_a_micro_batch_of_its_own_and_no_budget_is_one_micro_batch():
    assert microbatches.plan([50, 3, 4], budget=10) == [[[0], [2, 1]]]
    assert microbatches.plan([5, 3, 4], budget=None) == [[[0, 2, 1]]]
    assert microbatches.plan([5], budget=None, world=2) == [[[0]], [[]]]  # rank 1 runs an empty pass
    with pytest.raises(ValueError, match="max_tokens_per_microbatch"):
        microbatches.plan([5], budget=0)


def tiny_llama(seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
                                        pad_token_id=0))


def random_batch(rows=24, seed=1, returns=None):
    rng = random.Random(seed)
    prompts = [[rng.randrange(1, 64) for _ in range(rng.randint(2, 20))] for _ in range(rows)]
    completions = []
    for _ in range(rows):
        n = rng.randint(1, 12)
        completions.append(SimpleNamespace(token_ids=[rng.randrange(1, 64) for _ in range(n)],
                                           logprobs=[-rng.uniform(2.0, 6.0) for _ in range(n)], versions=[0] * n))
    return single_turn_batch(prompts, completions, returns or [rng.choice([-1.0, 0.0, 1.0]) for _ in range(rows)])


def test_rows_of_very_different_lengths_never_share_a_micro_batch():
    """A row at most half as long as its micro-batch's longest starts another, with a budget or without: padding
    never more than doubles a pass's tokens."""
    assert microbatches.plan([230, 60, 228, 63, 116, 115], budget=None) == [[[0, 2, 4], [5, 3, 1]]]
    assert microbatches.plan([230, 60, 228, 63], budget=460) == [[[0, 2], [3, 1]]]
    rng = random.Random(3)
    lengths = [rng.choice([rng.randint(200, 240), rng.randint(40, 90)]) for _ in range(80)]
    for world in (1, 2):
        for share in microbatches.plan(lengths, budget=None, world=world):
            for batch in share:
                assert not batch or max(lengths[r] for r in batch) < 2 * min(lengths[r] for r in batch)


@pytest.mark.parametrize("minibatches", [1, 2])
def test_the_update_does_not_depend_on_how_the_batch_was_cut(minibatches, monkeypatch):
    base = tiny_llama()
    results = []
    for budget in (None, 40):
        monkeypatch.setattr(padding, "MAX_SPREAD", float("inf") if budget is None else 2.0)  # None: one pass
        model = copy.deepcopy(base)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        state = ObjectiveState()
        for version in range(2):
            stats = policy_gradient_step(model, optimizer, random_batch(seed=version), Objective(minibatches=minibatches,
                                         advantage="grpo"), state, temperature=1.0, version=version,
                                         generator=torch.Generator().manual_seed(version),
                                         max_tokens_per_microbatch=budget)
        results.append((model, stats))
    (whole, whole_stats), (cut, cut_stats) = results
    assert cut_stats["microbatches"] > whole_stats["microbatches"] == minibatches
    diff = max((a - b).abs().max().item() for a, b in zip(whole.parameters(), cut.parameters()))
    moved = max((a - b).abs().max().item() for a, b in zip(whole.parameters(), base.parameters()))
    assert moved > 1e-4 and diff <= 1e-5, (moved, diff)
    for key in ("pg_loss", "clip_fraction", "logprob_gap", "grad_norm"):
        assert cut_stats[key] == pytest.approx(whole_stats[key], rel=1e-4, abs=1e-6), key


def test_activation_checkpointing_recomputes_the_same_update():
    base = tiny_llama()
    models = []
    for checkpointing in (False, True):
        model = copy.deepcopy(base)
        if checkpointing:
            model.gradient_checkpointing_enable()
            model.config.use_cache = False
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        policy_gradient_step(model, optimizer, random_batch(), Objective(minibatches=2, advantage="grpo"),
                             ObjectiveState(), temperature=1.0, generator=torch.Generator().manual_seed(0),
                             max_tokens_per_microbatch=64)
        models.append(model)
    assert models[1].is_gradient_checkpointing and not models[0].is_gradient_checkpointing
    diff = max((a - b).abs().max().item() for a, b in zip(models[0].parameters(), models[1].parameters()))
    assert diff <= 1e-6


@pytest.mark.parametrize("minibatches", [1, 2])
@pytest.mark.parametrize("returns", [[-1.0, 0.0, 1.0] * 8, [1.0] * 24])
def test_rows_with_no_gradient_are_not_computed_and_the_update_is_the_same(minibatches, returns, monkeypatch):
    """grpo_mean over returns of mean 0: the rows that returned 0 have advantage 0 and no gradient; with every row
    alike, none has one, and the optimizer still steps on a zero gradient (its moments and count move)."""
    base, results = tiny_llama(), []
    for skip in (True, False):
        if not skip:  # as before: every row computed
            every_row = lambda _objective, advantages, *_: advantages == advantages  # noqa: E731
            monkeypatch.setattr(microbatches, "trained_rows", every_row)
        model = copy.deepcopy(base)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        state = ObjectiveState()
        for version in range(2):
            stats = policy_gradient_step(model, optimizer, random_batch(seed=version, returns=returns),
                                         Objective(minibatches=minibatches, advantage="grpo_mean"), state,
                                         temperature=1.0, generator=torch.Generator().manual_seed(version),
                                         max_tokens_per_microbatch=64)
        results.append((model, stats))
    (skipping, skip_stats), (full, full_stats) = results
    assert full_stats["rows_trained"] == full_stats["rows"] == 24
    assert skip_stats["rows_trained"] == sum(r != 0 for r in returns) * (len(set(returns)) > 1)
    assert skip_stats["microbatches"] < full_stats["microbatches"]
    diff = max((a - b).abs().max().item() for a, b in zip(skipping.parameters(), full.parameters()))
    moved = max((a - b).abs().max().item() for a, b in zip(full.parameters(), base.parameters()))
    assert moved > 1e-6 and diff <= 1e-5, (moved, diff)  # float sums in other orders


def test_a_row_with_a_kl_term_or_an_entropy_bonus_is_trained_whatever_its_advantage():
    batch = random_batch(rows=4, returns=[0.0, 1.0, 0.0, 1.0])
    advantages = torch.tensor([0.0, 0.5, 0.0, -0.5])
    assert trained_rows(Objective(), advantages, batch, reference=None).tolist() == [False, True, False, True]
    assert trained_rows(Objective(entropy_coef=0.01), advantages, batch, None).all()
    anchored = Objective(kl_coef=0.1)
    assert trained_rows(anchored, advantages, batch, reference=object()).all()
    assert trained_rows(anchored, advantages, batch, reference=None).tolist() == [False, True, False, True]
    by_role = Objective(kl_coef_by_role={"other": 0.1})  # single_turn rows have role "" (no KL for them)
    assert trained_rows(by_role, advantages, batch, reference=object()).tolist() == [False, True, False, True]


def test_a_row_whose_advantage_is_a_baselines_residue_is_not_trained():
    """RAE's running baseline decays towards a role's constant return (a copy's 0 in propose_solve) but never reaches
    it: a row at -2e-10 costs a full pass for no gradient. A small advantage that is not such a residue is trained."""
    batch = random_batch(rows=4, returns=[0.0, 0.0, 1.0, 0.0])
    advantages = torch.tensor([-2e-10, 3e-7, 1e-3, -1e-4])
    assert trained_rows(Objective(), advantages, batch, reference=None).tolist() == [False, False, True, True]
    assert trained_rows(Objective(entropy_coef=0.01), advantages, batch, None).all()


def test_a_role_share_trains_a_seeded_sample_of_that_roles_rows_and_every_other_row():
    """row_share_by_role={proposer: 0.25}: about a quarter of the proposer's rows, the same draw on every rank (one
    seed), every solver row; with no share below 1 nothing is drawn, so the update's shuffle stays as it was."""
    batch = random_batch(rows=400, returns=[1.0, -1.0] * 200)
    batch.role_keys = [("propose_solve", "", "proposer" if i % 2 else "solver") for i in range(400)]
    proposer, advantages = torch.tensor([i % 2 == 1 for i in range(400)]), torch.ones(400)
    objective = Objective(row_share_by_role={"proposer": 0.25})
    kept = trained_rows(objective, advantages, batch, None, torch.Generator().manual_seed(7))
    assert kept[~proposer].all() and 30 <= int(kept[proposer].sum()) <= 70  # 50 expected, sd 6
    assert torch.equal(kept, trained_rows(objective, advantages, batch, None, torch.Generator().manual_seed(7)))
    assert not torch.equal(kept, trained_rows(objective, advantages, batch, None, torch.Generator().manual_seed(8)))
    generator = torch.Generator().manual_seed(7)
    assert trained_rows(Objective(row_share_by_role={"proposer": 1.0}), advantages, batch, None, generator).all()
    assert torch.equal(generator.get_state(), torch.Generator().manual_seed(7).get_state())


def test_a_row_share_is_a_number_in_0_to_1():
    for bad in (0, -0.5, 1.5, True, "half", None):
        with pytest.raises(ValueError, match="row share"):
            Objective(row_share_by_role={"proposer": bad})


def test_an_update_with_a_row_share_computes_only_the_rows_drawn():
    model, batch = tiny_llama(), random_batch(rows=24, returns=[1.0, -1.0] * 12)
    batch.role_keys = [("propose_solve", "main", "solver")] * 24
    stats = policy_gradient_step(model, torch.optim.AdamW(model.parameters(), lr=1e-3), batch,
                                 Objective(advantage="grpo_mean", row_share_by_role={"solver": 0.5}), ObjectiveState(),
                                 temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert stats["rows"] == 24 and 0 < stats["rows_trained"] < 24


def test_a_completion_cut_at_its_token_budget_is_left_out_of_the_update_when_the_objective_masks_it():
    batch = random_batch(rows=4, returns=[0.0, 1.0, 0.0, 1.0])
    batch.truncated = torch.tensor([False, True, True, False])  # the rows' action_truncated
    advantages = torch.tensor([0.5, 0.5, -0.5, -0.5])
    assert trained_rows(Objective(), advantages, batch, reference=None).all()  # train (the default): as any row
    masked = Objective(truncated_actions="mask")
    assert trained_rows(masked, advantages, batch, reference=None).tolist() == [True, False, False, True]
    assert trained_rows(Objective(truncated_actions="mask", entropy_coef=0.01), advantages, batch, None).tolist() == \
        [True, False, False, True]
    with pytest.raises(ValueError, match="truncated_actions must be one of train, mask, not 'drop'"):
        Objective(truncated_actions="drop")
