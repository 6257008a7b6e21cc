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
    # each class was refused where it was meant to be: reward knows no vocabulary, replay and the learner do
    assert set(rejected["reward"]) == {"null", "missing_id", "duplicate_row", "ragged", "token_id", "non_finite",
                                       "version"}
    assert rejected["replay"] == {"token_id": 2, "version": 2}
    assert sum(rejected["learner"].values()) == len(poison.poison_turns(10**6))  # the batch sent straight to it
    assert set(rejected["league"]) == {"seatless_learner", "unknown_learner", "seats", "non_finite"}
    assert outcome["dropped_frames"]["reward"] == outcome["dropped_frames"]["replay"] == 2  # the bad bodies
