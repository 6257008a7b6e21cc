"""A running baseline is not moved by a batch whose mean return no honest run gives. The review's run: one row of
return 3e38 made a role's RAE baseline 3.75e37, and every minibatch step of the next ~200 updates was skipped."""

import pytest
import torch

from algos.advantages import BASELINE_RANGE, StateValues, rae_advantages, role_group_advantages, state_advantages


def test_an_out_of_range_batch_leaves_its_roles_baseline_and_the_next_honest_batch_trains_against_it():
    returns = torch.tensor([1.0, 3e38, -1.0, -1.0])
    roles = torch.tensor([0, 0, 1, 1])
    advantages, stats = rae_advantages(returns, roles, {0: 0.5, 1: 0.0}, decay=0.5)
    assert stats["baselines"][0] == 0.5 and stats["baselines_skipped"] == 1
    assert stats["baselines"][1] == pytest.approx(0.25 * 0.0 + 0.75 * -1.0)  # the other role as ever: 2 rows, 0.5**2
    assert advantages[0].item() == pytest.approx(0.5)  # against the kept baseline
    honest, stats = rae_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), stats["baselines"], decay=0.5)
    assert stats["baselines"][0] == pytest.approx(0.25 * 0.5 + 0.75 * 0.5) and "baselines_skipped" not in stats
    assert honest.tolist() == pytest.approx([0.5, -0.5])


def test_a_role_seen_first_in_an_out_of_range_batch_gets_no_baseline():
    advantages, stats = rae_advantages(torch.tensor([-2e6, -2e6]), torch.tensor([3, 3]), {})
    assert stats["baselines"] == {} and stats["baselines_skipped"] == 1
    assert advantages.tolist() == [-2e6, -2e6]  # against 0
    _, stats = rae_advantages(torch.tensor([BASELINE_RANGE, BASELINE_RANGE]), torch.tensor([3, 3]), {})
    assert stats["baselines"] == {3: BASELINE_RANGE}  # the bound itself is in range


def test_in_range_batches_are_computed_as_before():
    returns, roles = torch.tensor([1.0, -1.0, 0.5, 2.0]), torch.tensor([0, 0, 1, 1])
    segments = torch.tensor([0, 1, 2, 2])
    advantages, stats = rae_advantages(returns, roles, {0: 0.2}, decay=0.9, segments=segments)
    b0 = 0.9**2 * 0.2 + (1 - 0.9**2) * 0.0  # role 0: two trajectories, mean 0
    b1 = 1.25  # role 1 is new: its batch mean
    assert stats["baselines"] == pytest.approx({0: b0, 1: b1}) and "baselines_skipped" not in stats
    assert advantages.tolist() == pytest.approx([1.0 - b0, -1.0 - b0, 0.5 - b1, 2.0 - b1])


def test_state_values_and_role_groups_keep_their_bounds_too():
    values = StateValues()
    returns, roles = torch.tensor([1.0, 3e38]), torch.tensor([0, 1])
    advantages, stats = state_advantages(returns, roles, ["a", "b"], {}, values)
    assert stats["baselines"] == {0: 1.0} and stats["baselines_skipped"] == 1
    assert values.get((1, "b")) == (0, 0.0) and values.get((0, "a")) == (1, 1.0)  # the poisoned state is not kept
    assert advantages[0].item() == 0.0
    _, stats = role_group_advantages(torch.tensor([3e38]), torch.tensor([0]), torch.tensor([0]), torch.tensor([0]),
                                     {0: 0.1})
    assert stats["baselines"] == {0: 0.1} and stats["baselines_skipped"] == 1
