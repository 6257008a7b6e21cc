"""Admission, alone: the count of started episodes and its limit, on which the staleness bound rests."""

import pytest
import trio
import trio.testing

from actors.env.admission import Admission, admission_share
from tests.factories import admit_all



def test_admission_shares_add_up_to_the_allowance_and_grow_with_it():
    for n in range(1, 6):
        for allowance in range(0, 40):
            shares = [admission_share(allowance, i, n) for i in range(n)]
            assert sum(shares) == allowance and max(shares) - min(shares) <= 1
            assert all(admission_share(allowance + 1, i, n) >= s for i, s in enumerate(shares))


@pytest.mark.parametrize("n", [1, 2, 3, 5])
@pytest.mark.parametrize("eta,version", [(0, 0), (2, 0), (1, 4)])
def test_n_actors_admit_exactly_the_allowance_between_them(n, eta, version):
    """(eta + v + 1) * B episodes started in all, less the v * B the learner consumed by version v (each
    actor's count starts at its share of that): exactly eta + 1 batches in flight, over any n."""
    batch = 7
    actors = [Admission("main", max_staleness=eta, batch_episodes=batch, slot=(i, n), versions={"main": version})
              for i in range(n)]
    assert sum(admit_all(a) for a in actors) == (eta + 1) * batch
    assert sum(a.statistics()["started"] for a in actors) == (eta + version + 1) * batch
    assert all(a.statistics()["admission_limit"] == a.statistics()["started"] for a in actors)


def woken_by(admission: Admission, *changes) -> list[list[str]]:
    """Apply ``changes`` (functions) one by one to ``admission`` while a task waits for it to change; what the
    waiter saw admitted when it woke (empty if it never did)."""
    woke = []

    async def main():
        async with trio.open_nursery() as nursery:
            async def waiter():
                await admission.wait_for_change()
                woke.append(admission.admitted())

            nursery.start_soon(waiter)
            for change in changes:
                await trio.testing.wait_all_tasks_blocked()
                change()
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()

    trio.run(main)
    return woke


def test_a_new_version_admits_one_more_batch_and_wakes_the_waiter():
    admission = Admission("main", max_staleness=1, batch_episodes=4)
    assert admit_all(admission) == 8
    assert woken_by(admission, lambda: admission.version_announced("main", 0)) == []  # not newer: nothing moves
    assert woken_by(admission, lambda: admission.version_announced("main", 1)) == [["main"]]
    assert admission.statistics()["admission_waits"] == 2
    assert admit_all(admission) == 4 and admission.version("main") == 1


def test_a_restart_counts_what_its_predecessors_delivered():
    """Version 2, eta 1, B 4, alone: 16 may be started in all, 8 consumed; 3 more delivered before the restart
    (their successors died in flight): this life starts 5."""
    admission = Admission("main", max_staleness=1, batch_episodes=4, versions={"main": 2}, started_before={"main": 3})
    assert admission.offset == 8 and admit_all(admission) == 5


def test_an_offset_replaces_the_share_of_what_the_learner_consumed():
    admission = Admission("main", max_staleness=0, batch_episodes=4, slot=(0, 2), versions={"main": 3}, offset=5)
    assert admission.offset == 5 and admit_all(admission) == 3  # share of 16 is 8; 5 counted


def test_an_episode_given_back_frees_its_place_and_wakes_the_waiter():
    """eta 0, B 2: both started, one errors. Its place must reopen at once: the learner waits for a second
    episode before it publishes the version that would otherwise wake the env actor."""
    admission = Admission("main", max_staleness=0, batch_episodes=2)
    assert admit_all(admission) == 2
    assert woken_by(admission, lambda: admission.given_back("main", "errored")) == [["main"]]
    assert admit_all(admission) == 1


def test_a_rebalance_keeps_the_total_within_the_allowance():
    """Two actors share 12 (eta 2, B 4, v 0) and start 6 each; a third joins. The launcher spreads the total
    (12) over the new shares (4 each): every count moves to its share, nobody may start more, and the total
    is unchanged. The next version then admits exactly one more batch over the three."""
    actors = [Admission("main", max_staleness=2, batch_episodes=4, slot=(i, 2)) for i in range(2)]
    assert [admit_all(a) for a in actors] == [6, 6]
    actors.append(Admission("main", max_staleness=2, batch_episodes=4, slot=(2, 3)))
    total = sum(a.statistics()["started"] for a in actors)
    for i, a in enumerate(actors):
        delta = admission_share(total, i, 3) - a.statistics()["started"]
        assert a.rebalance((i, 3), delta) == a.offset
    assert [a.statistics()["started"] for a in actors] == [4, 4, 4] and sum(admit_all(a) for a in actors) == 0
    for a in actors:
        a.version_announced("main", 1)
    assert sum(admit_all(a) for a in actors) == 4
    assert [a.statistics()["admission_slot"] for a in actors] == [[0, 3], [1, 3], [2, 3]]


def test_a_rebalance_to_a_slot_out_of_range_is_refused():
    admission = Admission("main", max_staleness=0, batch_episodes=4)
    with pytest.raises(ValueError, match="admission slot"):
        admission.rebalance((2, 2), 0)
    assert admission.slot == (0, 1)


def test_a_league_admits_each_member_against_its_own_learner_version():
    """Admission is per member: main at version 3 and rival at 0, eta 0, B 4; main's batch full does not stop
    rival's, and only main's new version admits more of main. A rebalance moves the actor's own member only."""
    admission = Admission("main", max_staleness=0, batch_episodes=4, versions={"main": 3, "rival": 0})
    assert sorted(admission.admitted()) == ["main", "rival"]
    assert admit_all(admission, "main") == 4
    assert admission.admitted() == ["rival"] and admit_all(admission, "rival") == 4
    assert admission.admitted() == [] and admission.statistics()["admission_limit"] == 16 + 4
    admission.version_announced("main", 4)
    assert admission.admitted() == ["main"] and admission.statistics()["versions"] == {"main": 4, "rival": 0}
    admission.rebalance((0, 1), -2)
    assert admit_all(admission, "main") == 6 and admit_all(admission, "rival") == 0
