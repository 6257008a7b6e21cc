"""OldestFirst without a loop: the order (oldest token version, then arrival), the byte cut, and what fits."""

import pyarrow as pa

from actors.replay.buffer import OldestFirst, episode_bytes, oldest_version
from streams.schema import Columns, trajectory_table
from tests.factories import row, versions_episode as episode


def sized(name: str, context: int) -> pa.Table:
    """An episode of one turn after a prompt of ``context`` tokens (its size grows with it)."""
    return trajectory_table([row(name, **{Columns.PROMPT_IDS: [1] * context})])


def names(episodes: list[pa.Table]) -> list[str]:
    return [e.column(Columns.EPISODE_ID)[0].as_py() for e in episodes]


def unlimited(batch_episodes: int) -> OldestFirst:
    return OldestFirst(batch_episodes, lambda: 2**40)


def test_the_oldest_token_decides_the_order_not_arrival_nor_the_newest_token():
    buffer = unlimited(3)
    buffer.hold(episode("new", [[4, 4]]))
    buffer.hold(episode("straggler", [[9], [2]]))  # its newest token is the newest of all; its oldest the oldest
    buffer.hold(episode("middle", [[3, 8]]))
    assert names(buffer.cut()) == ["straggler", "middle", "new"]


def test_episodes_of_one_oldest_version_go_in_arrival_order():
    buffer = unlimited(2)
    for name in ("first", "second", "third"):
        buffer.hold(episode(name, [[5, 6]]))
    buffer.hold(episode("older", [[4]]))
    assert names(buffer.cut()) == ["older", "first"]
    assert names(buffer.cut()) == ["second", "third"]
    assert oldest_version(episode("none", [[]])) == 0  # an episode without tokens counts as version 0


def test_a_batch_is_ready_at_batch_episodes_and_cut_at_that_many():
    buffer = unlimited(2)
    buffer.hold(episode("a", [[1]]))
    assert len(buffer) == 1 and not buffer.ready()
    buffer.hold(episode("b", [[1]]))
    buffer.hold(episode("c", [[1]]))
    assert buffer.ready()
    assert names(buffer.cut()) == ["a", "b"] and len(buffer) == 1
    assert names(buffer.cut()) == ["c"] and len(buffer) == 0  # a cut takes what is held, however few
    assert buffer.cut() == [] and buffer.bytes == 0


def test_the_byte_cut_stops_before_the_episode_that_would_overflow_and_counts_bytes_exactly():
    episodes = [sized(f"e{i}", 500) for i in range(5)]
    size = episode_bytes(episodes[0])
    limit = [0]
    buffer = OldestFirst(10, lambda: limit[0])
    limit[0] = buffer.overhead + 2 * size  # a body of exactly two episodes
    for e in episodes[:2]:
        buffer.hold(e)
    assert buffer.bytes == 2 * size and not buffer.ready()  # two fit exactly: not full yet, and fewer than 10
    buffer.hold(episodes[2])
    assert buffer.ready()  # the bytes held fill a batch before ten episodes do
    assert names(buffer.cut()) == ["e0", "e1"] and buffer.bytes == size
    buffer.hold(episodes[3])
    limit[0] -= 1  # a limit changed at run time holds at the next look: one byte short of two
    assert buffer.ready()
    assert names(buffer.cut()) == ["e2"] and buffer.bytes == size
    buffer.hold(episodes[4])
    limit[0] = buffer.overhead + 3 * size
    assert not buffer.ready() and names(buffer.cut()) == ["e3", "e4"] and buffer.bytes == 0


def test_an_episode_larger_than_the_budget_does_not_fit_and_goes_alone_if_held_anyway():
    small, large = sized("small", 1), sized("large", 5000)
    buffer = OldestFirst(4, lambda: buffer.overhead + 2 * episode_bytes(small))
    assert buffer.fits([small]) and buffer.fits([small, small]) and not buffer.fits([small, small, small])
    assert not buffer.fits([large])  # replay refuses it as it arrives: it could never be sent
    buffer.hold(large)  # held all the same (the limit fell since), it goes out alone, and first (it came first)
    buffer.hold(small)
    assert buffer.ready()
    assert names(buffer.cut()) == ["large"]
    assert names(buffer.cut()) == ["small"]
