"""The replay actor over in-memory streams: whole-episode batches, oldest policy version first, nothing lost."""

import trio

from streams.endpoints import Inbox, Outbox
from actors.replay.actor import ReplayActor, ReplayConfig
from actors.replay.buffer import oldest_version
from actors.replay.spill import BATCH_LOG, Spill
from streams.channels import MemoryTransport
from streams.schema import Columns, decode_batch, decode_table, encode_table
from streams.wire import Kind
from tests.factories import versions_episode as episode



def test_oldest_version_is_the_minimum_over_every_token():
    assert oldest_version(episode("e", [[4, 4], [3, 5]])) == 3
    assert oldest_version(episode("e", [[]])) == 0


def test_batches_take_the_oldest_episodes_first_and_lose_none():
    # arrival order: a straggler from version 1 comes after newer episodes
    arriving = [("a", 3), ("b", 3), ("c", 4), ("late", 1), ("d", 4), ("e", 5), ("f", 2), ("g", 6)]
    batches = []

    async def main():
        transport = MemoryTransport()
        replay = ReplayActor(ReplayConfig(batch_episodes=4, capacity_episodes=8))
        async with transport.open_receiver(capacity=1) as learner, trio.open_nursery() as nursery:
            addresses = await nursery.start(replay.run, transport, {"learner": [learner.address]})
            async with transport.open_sender([addresses["episodes"]]) as sender:
                out = Outbox(sender, Kind.EPISODES, "env")
                for name, version in arriving:
                    await out.send(encode_table(episode(name, [[version, version + 1]])))
                inbox = Inbox(learner, Kind.BATCH, decode_table)
                for _ in range(2):
                    ids = (await inbox.receive()).column(Columns.EPISODE_ID).to_pylist()
                    batches.append(list(dict.fromkeys(ids)))
            nursery.cancel_scope.cancel()

    trio.run(main)
    # the first batch is cut once at least four episodes are in, the straggler among them: it goes first
    version = dict(arriving)
    assert batches[0][0] == "late"
    for batch in batches:  # within a batch, oldest first
        assert [version[name] for name in batch] == sorted(version[name] for name in batch)
    assert sorted(sum(batches, [])) == sorted(version)  # every episode once


def test_a_restarted_replay_reloads_its_spill_drops_copies_and_rewinds(tmp_path):
    """Killed (cancelled) with one batch sent and episodes held: its successor holds the same episodes, drops
    a copy of one it has, and ``rewind(0)`` sends batch 1 again, numbered, before batch 2."""
    spill = str(tmp_path / "spill")
    got = []

    async def life(names: list[str], batches: int, rewind: int | None = None):
        transport = MemoryTransport()
        replay = ReplayActor(ReplayConfig(batch_episodes=2, capacity_episodes=8, spill_dir=spill))
        async with transport.open_receiver(capacity=1) as learner, trio.open_nursery() as nursery:
            addresses = await nursery.start(replay.run, transport, {"learner": [learner.address]})
            if rewind is not None:
                replay.rewind(rewind)
            async with transport.open_sender([addresses["episodes"]]) as sender:
                out = Outbox(sender, Kind.EPISODES, "reward")
                for name in names:
                    await out.send(encode_table(episode(name, [[1]])))
                inbox = Inbox(learner, Kind.BATCH, decode_batch)
                for _ in range(batches):
                    table, seq = await inbox.receive()
                    got.append((seq, list(dict.fromkeys(table.column(Columns.EPISODE_ID).to_pylist()))))
            with trio.fail_after(10):  # every episode taken (spilled on a thread) or dropped as a copy
                while sum(replay.statistics()[k] for k in ("episodes_in", "duplicate_episodes")) < len(names):
                    await trio.sleep(0.01)
            stats = replay.statistics()
            nursery.cancel_scope.cancel()
        return stats

    first = trio.run(life, ["env-0-0-0", "env-0-0-1", "env-1-0-0"], 1)
    assert first["batches_out"] == 1 and first["buffered"] == 1
    second = trio.run(life, ["env-1-0-0", "env-0-1-0"], 2, 0)  # env-1-0-0 again: the old reward resent it
    assert second["reloaded_episodes"] == 1 and second["duplicate_episodes"] == 1
    assert got == [(1, ["env-0-0-0", "env-0-0-1"]), (1, ["env-0-0-0", "env-0-0-1"]), (2, ["env-1-0-0", "env-0-1-0"])]
    assert second["received_by_source"] == {"env-0": 3, "env-1": 1}  # what each env actor delivered, once


def test_a_spill_cut_off_by_a_kill_loads_what_came_before(tmp_path):
    spill = Spill(str(tmp_path))
    for name in ("e-0-0", "e-0-1"):
        spill.add_episode(episode(name, [[1], [2]]))
    spill.add_batch(1, ["e-0-0"])
    (path,) = tmp_path.glob("episodes-*.arrows")
    path.write_bytes(path.read_bytes()[:-20])  # the last episode's record cut short
    with open(tmp_path / BATCH_LOG, "a") as f:
        f.write('{"seq": 2, "epis')  # and a batch line
    episodes, batches = spill.load()
    assert list(episodes) == ["e-0-0"] and episodes["e-0-0"].num_rows == 2
    assert batches == {1: ["e-0-0"]}
    assert [(seq, t.num_rows) for seq, t in spill.batches_after(0)] == [(1, 2)]
