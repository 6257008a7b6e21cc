"""Replay's spill over the lives of a run: compacted below the learner's checkpointed cursor (a restart reloads
what is live, and the accounts still find every episode), and taken over by a resumed run's replay."""

import json

import pytest
import torch
import trio
import trio.testing

from actors.models.checkpoint_dir import TRAINER_STATE
from actors.replay.actor import ReplayActor, ReplayConfig
from actors.replay.spill import BATCH_LOG, STATE, IdSet, Spill, account_episodes
from streams.channels import MemoryTransport
from streams.endpoints import Inbox, Outbox
from streams.schema import Columns, decode_batch, encode_table
from streams.wire import Kind
from tests.factories import versions_episode as episode


def checkpoint(policy, life: str, seq: int) -> None:
    """What the learner's checkpoint says of its data cursor (the rest of a checkpoint is not read here)."""
    policy.mkdir(parents=True, exist_ok=True)
    torch.save({"cursor": {"life": life, "seq": seq}}, policy / TRAINER_STATE)


async def serve(cfg: ReplayConfig, script):
    """Run a replay; ``script(replay, send, receive)`` drives it; returns its statistics at the end."""
    transport = MemoryTransport()
    replay = ReplayActor(cfg)
    async with transport.open_receiver(capacity=1) as learner, trio.open_nursery() as nursery:
        addresses = await nursery.start(replay.run, transport, {"learner": [learner.address]})
        inbox = Inbox(learner, Kind.BATCH, decode_batch)
        async with transport.open_sender([addresses["episodes"]]) as sender:
            out = Outbox(sender, Kind.EPISODES, "reward")

            async def send(*names: str) -> None:
                def taken() -> int:
                    return sum(replay.statistics()[k] for k in ("episodes_in", "duplicate_episodes"))

                before = taken()
                for name in names:
                    await out.send(encode_table(episode(name, [[1]])))
                with trio.fail_after(10):  # each one spilled (on a thread) or dropped as a copy
                    while taken() < before + len(names):
                        await trio.sleep(0.01)

            async def receive() -> tuple[int, list[str]]:
                with trio.fail_after(10):
                    table, seq = await inbox.receive()
                return seq, list(dict.fromkeys(table.column(Columns.EPISODE_ID).to_pylist()))

            await script(replay, send, receive)
        stats = replay.statistics()
        nursery.cancel_scope.cancel()
    return stats


def test_the_spill_is_compacted_below_the_checkpointed_cursor_and_the_accounts_hold(tmp_path):
    life, policy = "L1", tmp_path / "policy"
    spill_dir = tmp_path / "replay" / life
    cfg = ReplayConfig(batch_episodes=2, capacity_episodes=8, spill_dir=str(spill_dir), checkpoint_dir=str(policy))
    ids = [f"{life}/env-0-0-{n}" for n in range(7)]
    got = []

    async def first(replay, send, receive):
        await send(*ids[:4])
        got.extend([await receive(), await receive()])
        checkpoint(policy, life, 2)  # the learner checkpointed after batch 2
        await send(*ids[4:6])
        got.append(await receive())  # batch 3 went: replay looked at the checkpoint after it
        with trio.fail_after(10):
            while replay.statistics()["compacted_through"] < 2:
                await trio.sleep(0.01)
        await send(ids[0], ids[6])  # a copy of a compacted episode (a restarted reward's) is still a copy

    stats = trio.run(serve, cfg, first)
    assert got == [(1, ids[0:2]), (2, ids[2:4]), (3, ids[4:6])]
    assert stats["duplicate_episodes"] == 1 and stats["compacted_episodes"] == 4 and stats["buffered"] == 1
    spill = Spill(str(spill_dir))
    episodes, batches = spill.load()
    assert set(episodes) == set(ids[4:]) and batches == {3: ids[4:6]}  # what is live, on disk
    assert [json.loads(line)["seq"] for line in (spill_dir / BATCH_LOG).read_text().splitlines()] == [3]
    assert sum(1 for _ in spill_dir.glob("*.partial")) == 0 and spill.state.through == 2

    async def restarted(replay, send, receive):
        replay.rewind(2)  # the learner, restarted from its checkpoint
        got.append(await receive())

    again = trio.run(serve, cfg, restarted)
    assert again["reloaded_episodes"] == 1 and again["batches_logged"] == 3 and got[-1] == (3, ids[4:6])
    assert again["received_by_source"] == {"env-0": 7}  # the compacted ones counted from the spill's state
    with pytest.raises(RuntimeError, match="compacted"):
        spill.batches_after(1)  # below the checkpoint: gone, and said so

    (tmp_path / "ledger" / life).mkdir(parents=True)
    (tmp_path / "ledger" / life / "env-0.txt").write_text("\n".join(ids) + "\n")
    accounts = account_episodes(tmp_path, life, 3)
    assert accounts == {"produced": 7, "consumed": 6, "held": 1, "dropped": 0, "lost": 0, "duplicated": 0,
                        "unledgered": 0, "inherited": 0}
    # an episode produced and given back (unscored, refused on the way: the env actor's *.dropped ledger) is no loss
    extra = f"{life}/env-0-0-99"
    (tmp_path / "ledger" / life / "env-0.txt").write_text("\n".join([*ids, extra]) + "\n")
    assert account_episodes(tmp_path, life, 3)["lost"] == 1
    (tmp_path / "ledger" / life / "env-0.dropped").write_text(f"{extra} unscored\n")
    accounts = account_episodes(tmp_path, life, 3)
    assert (accounts["lost"], accounts["dropped"], accounts["produced"]) == (0, 1, 8)


def test_a_resumed_run_takes_over_the_previous_lives_episodes_and_batches(tmp_path):
    """Life A logged batches 1-3 and held one episode; its checkpoint consumed batch 1. Life B, once training
    starts, sends A's batches 2 and 3 as its own 1 and 2, then batches A's held episode with its own; life C (B
    made no checkpoint) takes over all of B's batches."""
    policy, root = tmp_path / "policy", tmp_path / "replay"
    a = Spill(str(root / "A"))
    old = [f"A/env-0-0-{n}" for n in range(7)]
    for name in old:
        a.add_episode(episode(name, [[1]]))
    for seq in range(1, 4):
        a.add_batch(seq, old[2 * seq - 2:2 * seq])
    checkpoint(policy, "A", 1)
    got = []

    def cfg(life):
        return ReplayConfig(batch_episodes=2, capacity_episodes=8, spill_dir=str(root / life),
                            checkpoint_dir=str(policy), resume=True)

    async def life_b(replay, send, receive):
        await send("B/env-0-0-0")
        await trio.testing.wait_all_tasks_blocked()
        assert replay.statistics()["held_back"] and replay.statistics()["batches_resent"] == 0
        replay.rewind(0)  # the run starts training (its resume evaluation was played meanwhile)
        got.extend([await receive() for _ in range(3)])

    stats = trio.run(serve, cfg("B"), life_b)
    assert got == [(1, old[2:4]), (2, old[4:6]), (3, [old[6], "B/env-0-0-0"])]
    assert stats["inherited_batches"] == 2 and stats["inherited_episodes"] == 5
    assert stats["received_by_source"] == {"env-0": 1}  # life A's env actors are gone: not counted for B's
    assert json.loads((root / "B" / STATE).read_text())["inherited"]["after"] == 1

    async def nothing(replay, send, receive):
        pass

    again = trio.run(serve, cfg("B"), nothing)  # B's replay restarted: nothing taken over twice
    assert again["batches_logged"] == 3 and again["inherited_episodes"] == 5 and again["reloaded_episodes"] == 0

    got.clear()

    async def life_c(replay, send, receive):
        replay.rewind(0)
        got.extend([await receive() for _ in range(3)])

    stats = trio.run(serve, cfg("C"), life_c)
    assert got == [(1, old[2:4]), (2, old[4:6]), (3, [old[6], "B/env-0-0-0"])]
    assert stats["inherited_batches"] == 3
    accounts = account_episodes(tmp_path, "C", 0)
    assert accounts["inherited"] == 6 and accounts["unledgered"] == 0 and accounts["held"] == 6


def test_an_id_set_keeps_runs_of_ids_as_ranges():
    ids = IdSet()
    for n in (3, 1, 2, 7, 5, 6):
        assert ids.add(f"L/env-0-0-{n}")
    assert not ids.add("L/env-0-0-2") and ids.add("odd")
    assert ids.ranges == {"L/env-0-0": [[1, 3], [5, 7]]} and len(ids) == 7
    assert "L/env-0-0-4" not in ids and "L/env-0-0-5" in ids and "L/env-0-1-5" not in ids and "odd" in ids
    assert ids.add("L/env-0-0-4") and ids.ranges == {"L/env-0-0": [[1, 7]]}
    assert sorted(ids) == sorted(["odd", *(f"L/env-0-0-{n}" for n in range(1, 8))])


def test_a_batch_line_cut_by_a_full_disk_does_not_swallow_the_next(tmp_path):
    """The review's demo (new 7): batch 2's line cut off (no newline), then logged again by the restarted replay:
    both batches are in the log, not one line that does not parse."""
    spill = Spill(str(tmp_path / "life"))
    spill.add_batch(1, ["life/env-0-0-1"])
    with open(spill.dir / BATCH_LOG, "a") as f:
        f.write('{"seq": 2, "episodes": ["life/env-0-0-2", "life/en')
    again = Spill(str(tmp_path / "life"))
    assert again.batches() == {1: ["life/env-0-0-1"]}
    again.add_batch(2, ["life/env-0-0-2", "life/env-0-0-3"])
    assert Spill(str(tmp_path / "life")).batches() == {1: ["life/env-0-0-1"],
                                                       2: ["life/env-0-0-2", "life/env-0-0-3"]}


def test_a_starting_replay_removes_the_partial_files_a_cut_write_left(tmp_path):
    spill = Spill(str(tmp_path / "life"))
    spill.add_batch(1, ["life/env-0-0-1"])
    for name in ("state.json.partial", "batches.jsonl.partial", "episodes-1-2.partial"):
        (spill.dir / name).write_bytes(b"cut")
    ReplayActor(ReplayConfig(spill_dir=str(spill.dir)))
    assert sorted(p.name for p in spill.dir.iterdir()) == [BATCH_LOG]
