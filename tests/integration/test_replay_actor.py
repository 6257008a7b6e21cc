"""The replay actor over in-memory streams: whole-episode batches, oldest policy version first, nothing lost."""

import trio

from actors.endpoints import Inbox, Outbox
from actors.replay import ReplayActor, ReplayConfig, oldest_version
from streams.channels import MemoryTransport
from streams.schema import Columns, decode_table, encode_table, trajectory_table
from streams.wire import Kind


def episode(name: str, versions: list[list[int]]):
    rows = [{Columns.EPISODE_ID: name, Columns.ENV_NAME: "test", Columns.SEED: 0, Columns.TURN: turn,
             Columns.AGENT: 0, Columns.MATCHUP: "main", Columns.POLICY_ID: "main", Columns.PROMPT_IDS: [1],
             Columns.ACTION_IDS: [2] * len(v), Columns.ACTION_TEXT: "", Columns.BEHAVIOUR_LOGPROBS: [-1.0] * len(v),
             Columns.POLICY_VERSIONS: v, Columns.REWARD: 0.0, Columns.TERMINATED: False, Columns.TRUNCATED: False,
             Columns.EPISODE_RETURN: 0.0, Columns.INVALID_ACTION: False, Columns.CREATED_AT: 0.0,
             Columns.GENERATED_AT: 0.0, Columns.SCORED_AT: 0.0} for turn, v in enumerate(versions)]
    return trajectory_table(rows)


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
