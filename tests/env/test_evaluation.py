"""The evaluation tally: results per seat, games with an invalid action, and the range of policy versions."""

from types import SimpleNamespace

from actors.env.evaluation import EvaluationTally


def row(versions: list[int], invalid: bool = False) -> tuple[list[int], bool]:
    return versions, invalid


def rows(*each: tuple[list[int], bool]) -> SimpleNamespace:
    """A game's rows as its episode's columns hold them."""
    return SimpleNamespace(versions=[versions for versions, _ in each], invalid=[invalid for _, invalid in each])


def test_results_are_counted_per_seat_from_the_returns():
    tally = EvaluationTally("t", "random", games_per_seat=2)
    tally.add(0, [1.0, -1.0], rows(row([4])))  # a win in seat 0
    tally.add(0, [0.0, 0.0], rows(row([4])))  # a draw
    tally.add(1, [1.0, -1.0], rows(row([4]), row([4], invalid=True), row([5], invalid=True)))  # a loss, one bad game
    summary = tally.summary()
    assert summary["seats"] == {0: {"games": 2, "wins": 1, "draws": 1, "losses": 0, "invalid": 0},
                                1: {"games": 1, "wins": 0, "draws": 0, "losses": 1, "invalid": 1}}
    assert summary["nonloss"] == (1.0 + 0.0) / 2 and not summary["done"]
    tally.finish()
    assert tally.summary()["done"]


def test_a_single_agent_task_wins_on_a_positive_return():
    tally = EvaluationTally("t", "random", games_per_seat=3)
    for episode_return in (0.5, 0.0, -1.0):
        tally.add(0, [episode_return], rows())
    assert tally.summary()["seats"][0] == {"games": 3, "wins": 1, "draws": 1, "losses": 1, "invalid": 0}


def test_the_version_range_covers_every_token_and_is_empty_without_the_policy():
    tally = EvaluationTally("t", "random", games_per_seat=3)
    tally.add(0, [1.0, 0.0], rows())  # fixed players only: no tokens
    assert (tally.summary()["version_min"], tally.summary()["version_max"]) == (None, None)
    tally.add(0, [1.0, 0.0], rows(row([6, 7]), row([])))  # an empty completion has no versions
    tally.add(1, [1.0, 0.0], rows(row([5, 9, 8])))
    tally.add(1, [0.0, 1.0], rows(row([6])))
    assert (tally.summary()["version_min"], tally.summary()["version_max"]) == (5, 9)
