"""The staleness bound per version and the adaptive bound (actors/learner/staleness.py), and the collapse guard
(actors/learner/guard.py) whose cooldown takes the bound down."""

import random

import pytest

from actors.env.admission import Admission
from actors.learner.guard import CollapseGuard, Guard
from actors.learner.staleness import AutoStaleness, StalenessBound, parse_max_staleness

NO_GUARD = Guard(enabled=False)


def pair(fixed: int | None, auto: AutoStaleness | None = None,
         guard: Guard = NO_GUARD) -> tuple[StalenessBound, CollapseGuard]:
    """The bound and the guard as the learner holds them: the bound asks the guard whether it is cooling down."""
    collapse = CollapseGuard(guard)
    return StalenessBound(fixed, auto or AutoStaleness(), collapse), collapse


def observe(bound: StalenessBound, guard: CollapseGuard, version: int, invalid, ess, turns: int = 0) -> dict:
    """What the learner reports after the update that made ``version`` (``LearnerActor._react``): the guard moves
    first, then the bound, which reads the guard's cooldown."""
    guarded = guard.observe(version, invalid, ess, turns, eta_floor=bound.floor)
    return {"eta": bound.observe(ess), "is_ess": ess, **guarded}


def run(bound: StalenessBound, guard: CollapseGuard, signals, start: int = 1) -> list[int]:
    """Publish a version per (invalid share, ess) after its update; the bound each version went out with."""
    etas = []
    for version, (invalid, ess) in enumerate(signals, start):
        observe(bound, guard, version, invalid, ess)
        etas.append(bound.published(version))
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
    bound, guard = pair(None, AutoStaleness(min=1, max=6, start=2, grow_after=2))
    rising = run(bound, guard, [(0.0, 0.99)] * 12)
    assert rising == [2, 3, 3, 4, 4, 5, 5, 6, 6, 6, 6, 6]  # one a grow_after batches, up to max
    falling = run(bound, guard, [(0.0, 0.4)] * 8, start=13)
    assert falling == [5, 4, 3, 2, 1, 1, 1, 1]  # one a version, down to min
    middle = run(bound, guard, [(0.0, 0.8)] * 4, start=21)  # between the thresholds: it stays
    assert middle == [1, 1, 1, 1]


def test_a_fixed_bound_stays_without_the_guard():
    bound, guard = pair(4)
    assert run(bound, guard, [(0.0, 0.2)] * 5) == [4] * 5


def test_the_bound_is_exact_at_every_moment_however_it_moves():
    """A token of version s is trainable until version s + eta_s, and only until then; s + eta_s never falls,
    so a turn's oldest token binds."""
    rng = random.Random(0)
    bound, guard = pair(None, AutoStaleness(min=0, max=5, start=3, grow_after=1))
    etas = {0: bound.published(0)}
    for version in range(1, 201):
        observe(bound, guard, version, 0.0, rng.choice([0.2, 0.99, 0.8]))
        etas[version] = bound.published(version)
        for s in range(max(version - 8, 0), version + 1):  # what the learner at this version may train on
            assert bound.within(version, s) == (version - s <= etas[s])
    assert min(etas.values()) == 0 and max(etas.values()) == 5
    assert all(abs(etas[v + 1] - etas[v]) <= 1 for v in range(200))
    assert all(s + etas[s] <= s + 1 + etas[s + 1] for s in range(200))


def test_a_forced_collapse_trips_the_guard_which_steps_down_rolls_back_and_says_so():
    bound, guard = pair(4, guard=Guard(invalid_rise=0.3, patience=2, cooldown=6, step_scale=0.5, anchor_every=5))
    for version in range(1, 21):  # healthy: invalid 0.02, anchors at 5, 10, 15, 20
        reaction = observe(bound, guard, version, 0.02, 0.95)
        if guard.anchor_due(version, 0.02, 0.95):
            guard.anchored(version)
        bound.published(version)
        assert reaction["guard_trips"] == 0 and not reaction["rollback"] and reaction["step_scale"] == 1.0
    assert guard.anchors == [15, 20]
    first = observe(bound, guard, 21, 0.7, 0.9)  # one suspicious batch: patience 2
    assert first["guard_trips"] == 0 and not guard.anchor_due(21, 0.7, 0.9)
    tripped = observe(bound, guard, 22, 0.9, 0.9)
    assert tripped["guard_trips"] == 1 and tripped["rollback"] and tripped["step_scale"] == 0.5
    assert tripped["guard_cooldown"] == 6 and guard.last_reason.startswith("invalid actions 0.90")
    etas = [tripped["eta"]] + [observe(bound, guard, v, 0.9, 0.9)["eta"] for v in range(23, 28)]
    assert etas == [3, 2, 1, 0, 0, 0]  # stale data stops, a version at a time
    assert guard.trips == 1  # no second trip during the cooldown
    after = [observe(bound, guard, v, 0.02, 0.95) for v in range(28, 33)]
    assert after[0]["step_scale"] == 1.0 and [a["eta"] for a in after] == [1, 2, 3, 4, 4]


def test_a_run_that_starts_with_many_invalid_actions_is_no_collapse():
    bound, guard = pair(2, guard=Guard(patience=2))
    shares = [0.9, 0.85, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1]  # a policy learning the format
    assert all(observe(bound, guard, v, s, 0.95)["guard_trips"] == 0 for v, s in enumerate(shares, 1))


def test_the_guard_trips_on_a_collapsing_importance_weight_ess_without_invalid_actions():
    bound, guard = pair(2, guard=Guard(ess_floor=0.3, patience=3, rollback=False))
    trips = [observe(bound, guard, v, None, ess)["guard_trips"] for v, ess in enumerate([0.9, 0.2, 0.1, 0.1], 1)]
    assert trips == [0, 0, 0, 1] and not observe(bound, guard, 5, None, 0.1)["rollback"]


def test_the_control_state_survives_a_checkpoint():
    bound, guard = pair(None, AutoStaleness(start=2))
    run(bound, guard, [(0.0, 0.99)] * 5)
    saved = {**bound.state(), **guard.state()}  # a checkpoint's "staleness_control", as the learner writes it
    again, again_guard = pair(None, AutoStaleness(start=2))
    again.restore(saved)
    again_guard.restore(saved)
    assert again.eta == bound.eta == 4 and again.etas == bound.etas
    assert again.within(5, 2) and not again.within(5, 1)  # version 1 went out with eta 2, version 2 with 3


# "staleness_control" as StalenessControl.state() wrote it before the bound and the guard were split, in the
# trainer_state.pt of a TicTacToe run (max_staleness=2, the default guard) checkpointed at version 9
FROM_A_RUN = {"eta": 2, "etas": {0: 2, 1: 2, 2: 2, 3: 2, 4: 2, 5: 2, 6: 2, 7: 2, 8: 2, 9: 2}, "trips": 0,
              "cooldown_left": 0, "suspicious": 0, "invalid_reference": 0.013244727847714896, "grow_streak": 0,
              "last_reason": ""}
# ... and as it wrote it in a guard's cooldown: max_staleness=auto (min 1, max 4, start 2, grow_after 1), the
# guard below; versions 1-10 healthy (invalid share 0.02, is_ess 0.97), then 11-13 at an invalid share of 0.8
# (a trip at version 12, and 13 suspicious again)
COOLDOWN_AUTO = AutoStaleness(min=1, max=4, start=2, grow_after=1)
COOLDOWN_GUARD = Guard(invalid_rise=0.3, patience=2, cooldown=6, anchor_every=5)
IN_A_COOLDOWN = {"eta": 2, "etas": {1: 3, 2: 4, 3: 4, 4: 4, 5: 4, 6: 4, 7: 4, 8: 4, 9: 4, 10: 4, 11: 4, 12: 3, 13: 2},
                 "trips": 1, "cooldown_left": 5, "suspicious": 1, "invalid_reference": 0.02, "grow_streak": 0,
                 "last_reason": "invalid actions 0.80 against 0.02 when healthy"}


def test_a_checkpoint_written_before_the_split_restores_into_the_bound_and_the_guard():
    bound, guard = pair(2, guard=Guard())
    bound.restore(FROM_A_RUN)
    guard.restore(FROM_A_RUN)
    assert {**bound.state(), **guard.state()} == FROM_A_RUN  # and is written again with the same keys
    assert guard.invalid_reference == FROM_A_RUN["invalid_reference"] and not guard.cooling_down
    assert bound.within(9, 7) and not bound.within(9, 6)

    bound, guard = pair(None, COOLDOWN_AUTO, COOLDOWN_GUARD)
    bound.restore(IN_A_COOLDOWN)
    guard.restore(IN_A_COOLDOWN)
    assert {**bound.state(), **guard.state()} == IN_A_COOLDOWN
    assert guard.trips == 1 and guard.cooling_down and guard.step_scale == 0.5
    assert bound.within(15, 11) and not bound.within(16, 12)  # version 11 went out with eta 4, version 12 with 3
    # it goes on as StalenessControl went on from there: the rest of the cooldown at min, then up by one a version
    going_on = [observe(bound, guard, v, 0.02, 0.97) for v in range(14, 22)]
    assert [r["eta"] for r in going_on] == [1, 1, 1, 1, 2, 3, 4, 4]
    assert [r["guard_cooldown"] for r in going_on] == [4, 3, 2, 1, 0, 0, 0, 0]
    assert [r["step_scale"] for r in going_on] == [0.5] * 4 + [1.0] * 4


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
    small, large = CollapseGuard(Guard(patience=2)), CollapseGuard(Guard(patience=2))
    for guard, turns in ((small, 19), (large, 300)):
        bound = StalenessBound(2, guard=guard)
        for version, share in enumerate([0.2, 0.2, 0.45, 0.5], 1):
            observe(bound, guard, version, share, 0.99, turns)
    assert (small.trips, large.trips) == (0, 1)
