"""Replay's ceiling on versions follows the learner's lives as the learner's own bound does
(``Trainer.newest_version``): a replay that starts after the learner came back at an older checkpoint refuses none of
the episodes its dead predecessor's later weights sampled, and still refuses a version no life can have reached."""

import pyarrow as pa
import trio

from actors.replay.actor import VERSION_SLACK, ReplayActor, ReplayConfig
from streams.channels import MemoryTransport
from streams.endpoints import Inbox, Outbox
from streams.messages import VERSION_TOPIC, VersionAnnounced
from streams.schema import Columns, decode_batch, encode_table
from streams.wire import Kind
from tests.factories import versions_episode as episode


def kept_and_refused(announced: list[VersionAnnounced], versions: dict[str, int], **config) -> tuple[set, dict]:
    """Episodes (name -> the version of their tokens) sent, in order, to a fresh replay (B = 1) after ``announced``:
    the names that went out in batches, and replay's statistics. (Each batch sent raises the ceiling by one: the
    learner's version rises an update a batch; so an episode over it is sent first.)"""
    kept = set()

    async def main():
        transport = MemoryTransport()
        replay = ReplayActor(ReplayConfig(batch_episodes=1, capacity_episodes=8, **config))
        async with transport.open_receiver(capacity=8) as learner, transport.open_publisher() as publisher, \
                trio.open_nursery() as nursery:
            addresses = await nursery.start(replay.run, transport, {"learner": [learner.address],
                                                                    "versions": [publisher.address]})
            versions_out = Outbox(publisher, Kind.VERSION, "learner", topic=VERSION_TOPIC + b"main")
            for announcement in announced:
                await versions_out.send(announcement.to_body())
            async with transport.open_sender([addresses["episodes"]]) as sender:
                out = Outbox(sender, Kind.EPISODES, "reward")
                for name, version in versions.items():
                    await out.send(encode_table(episode(name, [[version]])))
                inbox = Inbox(learner, Kind.BATCH, decode_batch)
                with trio.fail_after(10):  # every episode kept (a batch each) or rejected
                    while len(kept) + replay.statistics().get("rejected_episodes", 0) < len(versions):
                        with trio.move_on_after(0.05):
                            table, _ = await inbox.receive()
                            kept.update(table.column(Columns.EPISODE_ID).to_pylist())
            stats = replay.statistics()
            nursery.cancel_scope.cancel()
        return stats

    return kept, trio.run(main)


def test_after_a_learner_restart_to_an_older_checkpoint_a_new_replay_keeps_the_dead_lifes_episodes():
    # the learner died at version 80 and came back at its checkpoint, version 50 (life 1); replay started after
    kept, stats = kept_and_refused([VersionAnnounced("main", 50, life=1)],
                                   {"beyond-any-life": 50 + 50 + VERSION_SLACK + 1, "sampled-at-79": 79,
                                    "sampled-at-50": 50}, checkpoint_every=50)
    assert kept == {"sampled-at-79", "sampled-at-50"}  # the learner (up to 50 + checkpoint_every) takes them
    assert stats["rejected_by_reason"] == {"version": 1} and stats["learner_life"] == 1


def test_in_a_fresh_runs_first_life_the_ceiling_is_the_announced_version_and_without_checkpoints_none_after():
    kept, _ = kept_and_refused([VersionAnnounced("main", 10, life=0)], {"at-15": 15, "at-14": 10 + VERSION_SLACK},
                               checkpoint_every=50)
    assert kept == {"at-14"}
    kept, _ = kept_and_refused([VersionAnnounced("main", 10, life=1)], {"far": 10**6}, checkpoint_every=0)
    assert kept == {"far"}  # no periodic checkpoints: how far the dead learner got is not known, as for the learner
    kept, _ = kept_and_refused([VersionAnnounced("main", 10, life=0)], {"at-65": 65, "at-64": 64}, checkpoint_every=50,
                               resume=True)
    assert kept == {"at-64"}  # a resumed run's first learner: its predecessor may have gone checkpoint_every further


def test_an_episode_replay_rejects_or_refuses_is_told_to_the_env_actor_that_played_it():
    """Rejected whole (a token id outside the vocabulary) or refused (alone larger than any batch): either way replay
    says so on the topic of the episode's env actor, which gives its admission back; a kept one is not told."""
    from streams.messages import EpisodeDropped, dropped_topic

    async def main():
        transport = MemoryTransport()
        replay = ReplayActor(ReplayConfig(batch_episodes=2, capacity_episodes=8, vocab_size=3, max_batch_bytes=8000))
        async with transport.open_receiver(capacity=8) as learner, trio.open_nursery() as nursery:
            addresses = await nursery.start(replay.run, transport, {"learner": [learner.address]})
            async with transport.open_subscriber([addresses["dropped"]], [dropped_topic("env-0")], capacity=16) as sub:
                notices = Inbox(sub, Kind.DROPPED, EpisodeDropped.from_body, topic=True)
                async with transport.open_sender([addresses["episodes"]]) as sender:
                    out = Outbox(sender, Kind.EPISODES, "reward")
                    await out.send(encode_table(episode("L/env-0-0-1", [[1]])))  # kept
                    await out.send(encode_table(with_action(episode("L/env-0-0-2", [[1]]), 9)))  # no such token
                    await out.send(encode_table(episode("L/env-0-0-3", [[1]] * 200)))  # too large for a batch
                    with trio.fail_after(10):
                        told = [await notices.receive() for _ in range(2)]
            nursery.cancel_scope.cancel()
        return told, replay.statistics()

    told, stats = trio.run(main)
    assert told == [EpisodeDropped("main", "L/env-0-0-2", "rejected_by_replay"),
                    EpisodeDropped("main", "L/env-0-0-3", "refused_by_replay")]
    assert stats["drop_notices"] == 2 and stats["episodes_in"] == 1


def with_action(table: pa.Table, token: int) -> pa.Table:
    """``table`` with every row's one action token ``token``."""
    i = table.schema.get_field_index(Columns.ACTION_IDS)
    return table.set_column(i, Columns.ACTION_IDS, pa.array([[token]] * table.num_rows, pa.list_(pa.int32())))
