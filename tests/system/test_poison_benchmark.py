"""tests/support/poison.py (which benchmarks/poison.py runs): well-typed poison of every class through a live
reward -> replay -> learner pipeline and a league, over ZeroMQ; none of it is found in a spill, a trained batch or
the journal, and no honest row is lost."""

from tests.support import poison


def test_no_poison_is_kept_and_every_honest_row_is(tiny_model_dir):
    outcome = poison.run(1, quiet=True, model=str(tiny_model_dir))
    assert outcome["poison_rows"] > 40 and outcome["poison_kept"] == 0 and not outcome["crashed"]
    assert outcome["honest_spilled"] == outcome["honest_rows"] > 0  # every honest turn reached replay's spill
    assert outcome["trained_rows"] > 0 and outcome["league_matches_after_resume"] == 6
    rejected = outcome["rejected"]
    # each class was refused where it was meant to be: reward knows no vocabulary nor context, replay and the
    # learner do; reward bounds rewards, the learner does not (its baselines do: algos/advantages.py)
    assert set(rejected["reward"]) == {"null", "missing_id", "duplicate_row", "no_action", "ragged", "token_id",
                                       "non_finite", "logprob", "magnitude", "version"}
    assert rejected["replay"] == {"token_id": 2, "too_long": 1, "version": 2}
    straight = len(poison.poison_turns(10**6, 10**6)) - len(poison.LEARNER_UNBOUNDED)  # the batch sent to it
    assert sum(rejected["learner"].values()) == straight and rejected["learner"]["too_long"] == 1
    assert set(rejected["league"]) == {"seatless_learner", "unknown_learner", "seats", "non_finite"}
    assert outcome["dropped_frames"]["reward"] == outcome["dropped_frames"]["replay"] == 2  # the bad bodies
