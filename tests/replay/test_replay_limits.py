"""Replay under honest long-context episodes, over real ZeroMQ sockets: batches cut by bytes as well as episodes,
and an episode too large for any batch refused with a counted reason, before it is spilled."""

import random

import pyarrow as pa
import trio

from actors.replay.actor import ReplayActor, ReplayConfig
from actors.replay.spill import BATCH_LOG, Spill
from streams.channels import ZmqTransport
from streams.endpoints import Inbox, Outbox
from streams.schema import Columns, decode_batch, encode_table, trajectory_table
from streams.wire import FRAME_LIMITS, Kind

LIMIT = 2 * 2**20  # the batch frame limit in this test: 64 of the episodes below take twice as much


def long_episode(name: str, turns: int = 4, context: int = 4000, seed: int = 0) -> pa.Table:
    """An honest long-context episode: each turn's prompt is the last ``context`` tokens of the game so far."""
    rng = random.Random(seed)
    rows = [{Columns.EPISODE_ID: name, Columns.ENV_NAME: "test", Columns.SEED: seed, Columns.TURN: turn,
             Columns.AGENT: 0, Columns.MATCHUP: "main", Columns.POLICY_ID: "main",
             Columns.PROMPT_IDS: [rng.randrange(50_000) for _ in range(context)], Columns.ACTION_IDS: [7] * 8,
             Columns.ACTION_TEXT: "move", Columns.BEHAVIOUR_LOGPROBS: [-0.5] * 8, Columns.POLICY_VERSIONS: [1] * 8,
             Columns.REWARD: 0.0, Columns.TERMINATED: turn == turns - 1, Columns.TRUNCATED: False,
             Columns.EPISODE_RETURN: 1.0, Columns.INVALID_ACTION: False, Columns.CREATED_AT: 0.0,
             Columns.GENERATED_AT: 0.0, Columns.SCORED_AT: 0.0} for turn in range(turns)]
    return trajectory_table(rows)


def test_long_context_episodes_go_out_in_batches_within_the_frame_limit(tmp_path, monkeypatch):
    monkeypatch.setitem(FRAME_LIMITS, Kind.BATCH, LIMIT)  # read by replay and by the learner's inbox alike
    honest = [long_episode(f"env-0-0-{i}", seed=i) for i in range(80)]
    giant = long_episode("env-1-0-0", turns=2, context=300_000)  # alone larger than a batch may be
    spill_dir = tmp_path / "spill"
    got = []

    async def main():
        transport = ZmqTransport()
        replay = ReplayActor(ReplayConfig(batch_episodes=64, capacity_episodes=128, spill_dir=str(spill_dir)))
        async with transport.open_receiver(capacity=1) as learner, trio.open_nursery() as nursery:
            addresses = await nursery.start(replay.run, transport, {"learner": [learner.address]})
            inbox = Inbox(learner, Kind.BATCH, decode_batch)
            async with transport.open_sender([addresses["episodes"]], capacity=16) as sender:
                out = Outbox(sender, Kind.EPISODES, "reward")
                for i, episode in enumerate(honest):
                    await out.send(encode_table(episode))
                    if i == 10:
                        await out.send(encode_table(giant))
                with trio.fail_after(30):  # every episode taken (spilled on a thread) or refused
                    while replay.statistics()["episodes_in"] + replay.statistics()["refused_episodes"] <= len(honest):
                        await trio.sleep(0.01)
                    # then every honest episode went out in a batch or is held, and no batch is due
                    while sum(len(ids) for _, ids in got) + replay.statistics()["buffered"] < len(honest) \
                            or replay.buffer.ready():
                        table, seq = await inbox.receive()
                        got.append((seq, table.column(Columns.EPISODE_ID).unique().to_pylist()))
            stats, learner_stats = replay.statistics(), inbox.statistics()
            nursery.cancel_scope.cancel()
        return stats, learner_stats

    stats, learner_stats = trio.run(main)
    names = [name for _, ids in got for name in ids]
    held = len(honest) - len(names)
    assert [seq for seq, _ in got] == list(range(1, len(got) + 1))
    assert names == [f"env-0-0-{i}" for i in range(len(names))]  # in order, each once, none lost
    assert len(got) >= 2 and all(len(ids) < 64 for _, ids in got)  # cut by bytes, not at 64 episodes
    assert stats["short_batches"] == len(got) and stats["buffered"] == held
    assert learner_stats["dropped_frames"] == 0  # every batch frame within the (patched) limit
    assert stats["batch_bytes_limit"] < LIMIT
    assert stats["refused_by_reason"] == {"larger_than_batch_limit": 1} and stats["refused_episodes"] == 1
    # refused before the spill: neither among the episodes on disk nor in a logged batch
    episodes, batches = Spill(str(spill_dir)).load()
    assert "env-1-0-0" not in episodes and len(episodes) == len(honest)
    assert "env-1-0-0" not in (spill_dir / BATCH_LOG).read_text() and len(batches) == len(got)


def test_a_batch_body_is_as_large_as_replay_reckons():
    """The byte cut rests on this: a batch's body is its stream's own bytes plus each episode's record batches."""
    replay = ReplayActor(ReplayConfig(batch_episodes=4, capacity_episodes=4))
    episodes = [long_episode(f"e-0-{i}", turns=1 + i, context=100 * i + 1) for i in range(4)]
    body = encode_table(pa.concat_tables(episodes), batch_seq=123456)
    assert len(body) <= replay.buffer.batch_bytes(episodes) <= len(body) + 64
