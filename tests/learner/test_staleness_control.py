"""The staleness bound per version, the adaptive bound and the collapse guard (actors/learner/staleness.py)."""

import random

import pytest

from actors.env.admission import Admission
from actors.learner.staleness import AutoStaleness, Guard, StalenessControl, parse_max_staleness

NO_GUARD = Guard(enabled=False)


def run(control: StalenessControl, signals, start: int = 1) -> list[int]:
    """Publish a version per (invalid share, ess) after its update; the bound each version went out with."""
    etas = []
    for version, (invalid, ess) in enumerate(signals, start):
        control.observe(version, invalid, ess)
        etas.append(control.published(version))
    return etas


def test_max_staleness_is_an_integer_or_auto():
    assert parse_max_staleness(3) == 3 and parse_max_staleness("auto") is None and parse_max_staleness("AUTO") is None
    for bad in (-1, "4", "sometimes", 2.5, True, None):
        with pytest.raises(ValueError, match="learner.max_staleness"):
            parse_max_staleness(bad)
    with pytest.raises(ValueError, match="min <= start <= max"):
        AutoStaleness(min=3, start=2)
    with pytest.raises(ValueError, match="ess_shrink <= ess_grow"):
        AutoStaleness(ess_grow=0.5, ess_shrink=0.8)


def test_the_adaptive_bound_rises_on_on_policy_data_and_falls_when_the_weights_degrade():
    control = StalenessControl(None, AutoStaleness(min=1, max=6, start=2, grow_after=2), NO_GUARD)
    rising = run(control, [(0.0, 0.99)] * 12)
    assert rising == [2, 3, 3, 4, 4, 5, 5, 6, 6, 6, 6, 6]  # one a grow_after batches, up to max
    falling = run(control, [(0.0, 0.4)] * 8, start=13)
    assert falling == [5, 4, 3, 2, 1, 1, 1, 1]  # one a version, down to min
    middle = run(control, [(0.0, 0.8)] * 4, start=21)  # between the thresholds: it stays
    assert middle == [1, 1, 1, 1]


def test_a_fixed_bound_stays_without_the_guard():
    control = StalenessControl(4, guard=NO_GUARD)
    assert run(control, [(0.0, 0.2)] * 5) == [4] * 5


def test_the_bound_is_exact_at_every_moment_however_it_moves():
    """A token of version s is trainable until version s + eta_s, and only until then; s + eta_s never falls,
    so a turn's oldest token binds."""
    rng = random.Random(0)
    control = StalenessControl(None, AutoStaleness(min=0, max=5, start=3, grow_after=1), NO_GUARD)
    etas = {0: control.published(0)}
    for version in range(1, 201):
        control.observe(version, 0.0, rng.choice([0.2, 0.99, 0.8]))
        etas[version] = control.published(version)
        for s in range(max(version - 8, 0), version + 1):  # what the learner at this version may train on
            assert control.within(version, s) == (version - s <= etas[s])
    assert min(etas.values()) == 0 and max(etas.values()) == 5
    assert all(abs(etas[v + 1] - etas[v]) <= 1 for v in range(200))
    assert all(s + etas[s] <= s + 1 + etas[s + 1] for s in range(200))


def test_a_forced_collapse_trips_the_guard_which_steps_down_rolls_back_and_says_so():
    control = StalenessControl(4, guard=Guard(invalid_rise=0.3, patience=2, cooldown=6, step_scale=0.5,
                                              anchor_every=5))
    for version in range(1, 21):  # healthy: invalid 0.02, anchors at 5, 10, 15, 20
        reaction = control.observe(version, 0.02, 0.95)
        if control.anchor_due(version, 0.02, 0.95):
            control.anchored(version)
        control.published(version)
        assert reaction["guard_trips"] == 0 and not reaction["rollback"] and reaction["step_scale"] == 1.0
    assert control.anchors == [15, 20]
    first = control.observe(21, 0.7, 0.9)  # one suspicious batch: patience 2
    assert first["guard_trips"] == 0 and not control.anchor_due(21, 0.7, 0.9)
    tripped = control.observe(22, 0.9, 0.9)
    assert tripped["guard_trips"] == 1 and tripped["rollback"] and tripped["step_scale"] == 0.5
    assert tripped["guard_cooldown"] == 6 and control.last_reason.startswith("invalid actions 0.90")
    etas = [tripped["eta"]] + [control.observe(v, 0.9, 0.9)["eta"] for v in range(23, 28)]
    assert etas == [3, 2, 1, 0, 0, 0]  # stale data stops, a version at a time
    assert control.trips == 1  # no second trip during the cooldown
    after = [control.observe(v, 0.02, 0.95) for v in range(28, 33)]
    assert after[0]["step_scale"] == 1.0 and [a["eta"] for a in after] == [1, 2, 3, 4, 4]


def test_a_run_that_starts_with_many_invalid_actions_is_no_collapse():
    control = StalenessControl(2, guard=Guard(patience=2))
    shares = [0.9, 0.85, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1]  # a policy learning the format
    assert all(control.observe(v, s, 0.95)["guard_trips"] == 0 for v, s in enumerate(shares, 1))


def test_the_guard_trips_on_a_collapsing_importance_weight_ess_without_invalid_actions():
    control = StalenessControl(2, guard=Guard(ess_floor=0.3, patience=3, rollback=False))
    trips = [control.observe(v, None, ess)["guard_trips"] for v, ess in enumerate([0.9, 0.2, 0.1, 0.1], 1)]
    assert trips == [0, 0, 0, 1] and not control.observe(5, None, 0.1)["rollback"]


def test_the_control_state_survives_a_checkpoint():
    control = StalenessControl(None, AutoStaleness(start=2), NO_GUARD)
    run(control, [(0.0, 0.99)] * 5)
    again = StalenessControl(None, AutoStaleness(start=2), NO_GUARD)
    again.restore(control.state())
    assert again.eta == control.eta == 4 and again.etas == control.etas
    assert again.within(5, 2) and not again.within(5, 1)  # version 1 went out with eta 2, version 2 with 3


def test_admission_follows_the_bound_the_learner_announces():
    admission = Admission("main", max_staleness=2, batch_episodes=4)
    assert admission.limit("main") == 12  # (2 + 0 + 1) * 4
    admission.version_announced("main", 1, life=0, eta=3)
    assert admission.eta("main") == 3 and admission.limit("main") == 20  # (3 + 1 + 1) * 4
    admission.version_announced("main", 2, life=0)  # no bound said: the last one holds
    assert admission.limit("main") == 24
    admission.version_announced("main", 3, life=0, eta=2)
    assert admission.limit("main") == 24 and admission.statistics()["etas"] == {"main": 2}


def test_a_run_never_appends_to_another_runs_directory(tmp_path):
    from actors.runs.driver import run_directory

    first = run_directory(tmp_path, "bench", resumed=False)
    (first / "config.json").write_text("{}")
    second = run_directory(tmp_path, "bench", resumed=False)
    (second / "metrics.jsonl").write_text("")
    third = run_directory(tmp_path, "bench", resumed=False)
    assert (first.name, second.name, third.name) == ("bench", "bench-2", "bench-3")
    assert run_directory(tmp_path, "bench", resumed=True) == first  # a resume goes on where it was
    (tmp_path / "empty").mkdir()
    assert run_directory(tmp_path, "empty", resumed=False).name == "empty"  # nothing there yet: it is taken


def test_a_small_batchs_chance_jump_in_invalid_actions_is_no_trip_a_large_batchs_is():
    """0.2 -> 0.45 over 19 turns is within three standard deviations of chance; over 300 turns it is a collapse."""
    small, large = StalenessControl(2, guard=Guard(patience=2)), StalenessControl(2, guard=Guard(patience=2))
    for control, turns in ((small, 19), (large, 300)):
        for version, share in enumerate([0.2, 0.2, 0.45, 0.5], 1):
            control.observe(version, share, 0.99, turns)
    assert (small.trips, large.trips) == (0, 1)
