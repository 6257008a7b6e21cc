"""Values checked where they arrive, over real ZeroMQ sockets: reward, replay, rollout and league keep nothing they
refuse, count it by reason, and go on with the rest.

The review's findings, one a test: a 3 KB frame with a bad middle offset passed reward and replay; a null
``episode_id`` killed replay and, spilled first, killed the restarted replay again on reload; a token id beyond
the vocabulary passed the request check and crashed the sampler; a league result whose learner holds no seat was
journaled, then crashed the league on every resume.
"""

import json
import math

import pyarrow as pa
import trio

from actors.league.actor import JOURNAL_FILE, LeagueActor, LeagueConfig
from actors.replay.actor import VERSION_SLACK, ReplayActor, ReplayConfig
from actors.reward.actor import RewardActor, RewardConfig
from actors.rollout.actor import RolloutActor, RolloutConfig
from actors.replay.spill import Spill
from streams.channels import ZmqTransport
from streams.endpoints import Inbox, Outbox
from streams.messages import VERSION_TOPIC, GenerationRequest, MatchResult, VersionAnnounced, decode_completions
from streams.schema import Columns as C
from streams.schema import decode_batch, decode_table, encode_table, trajectory_table
from streams.values import check_rows
from streams.wire import FrameCounter, Kind
from tests.factories import bad_middle_offset, compressed
from tests.factories import POISON, row


def episode(name: str, *rows: dict) -> pa.Table:
    """An episode of ``rows`` (honest ones by default), renamed ``name`` where a row carries an id."""
    rows = rows or (row(turn=0), row(turn=1))
    return trajectory_table([{**r, C.EPISODE_ID: name if r[C.EPISODE_ID] else r[C.EPISODE_ID], C.TURN: t}
                             for t, r in enumerate(rows)])


def poisoned_episodes() -> dict[str, pa.Table]:
    """One episode per kind of poison: an honest turn, then the poisoned one."""
    return {reason: episode(f"env-0-{reason}", row(), poison) for reason, poison in POISON.items()}


def test_reward_passes_on_only_what_passes_and_counts_the_rest():
    seen = {"tables": []}

    async def main():
        transport = ZmqTransport()
        reward = RewardActor(RewardConfig())
        async with transport.open_receiver(capacity=16) as replay, trio.open_nursery() as nursery:
            addresses = await nursery.start(reward.run, transport, {"replay": [replay.address]})
            inbox = Inbox(replay, Kind.EPISODES, decode_table)

            async def send():
                async with transport.open_sender([addresses["episodes"]]) as sender:
                    out = Outbox(sender, Kind.EPISODES, "env-0")
                    await out.send(bad_middle_offset())
                    await out.send(compressed(episode("env-0-zstd")))
                    for table in poisoned_episodes().values():
                        await out.send(encode_table(table))
                    await out.send(encode_table(episode("env-0-all-bad", POISON["non_finite"], POISON["ragged"])))
                    await out.send(encode_table(episode("env-0-huge", row(), row(**{C.REWARD: 3e38}))))
                    await out.send(encode_table(episode("env-0-last")))
                    await sender.drain()

            nursery.start_soon(send)
            with trio.fail_after(30):
                while not seen["tables"] or seen["tables"][-1].column(C.EPISODE_ID)[0].as_py() != "env-0-last":
                    seen["tables"].append(await inbox.receive())
            seen["stats"] = reward.statistics()
            nursery.cancel_scope.cancel()

    trio.run(main)
    tables, stats = seen["tables"], seen["stats"]
    assert all(check_rows(t).rejected == {} for t in tables)  # nothing poisoned reached replay ...
    rows = {t.column(C.EPISODE_ID)[0].as_py(): t.num_rows for t in tables}
    # ... and every honest row did; reward knows no vocabulary: replay and the learner check token ids against it
    assert rows == {**{f"env-0-{reason}": 1 for reason in POISON}, "env-0-token_id": 2, "env-0-huge": 1,
                    "env-0-last": 2}
    assert stats["streams"]["episodes"]["dropped_by_reason"] == {"bad_body": 2}  # the bad offset, the zstd body
    assert stats["rejected_by_reason"] == {"null": 1, "missing_id": 1, "empty_prompt": 1, "no_action": 1, "ragged": 2,
                                           "non_finite": 2, "logprob": 1, "magnitude": 1, "version": 1}
    assert stats["rejected_episodes"] == 1  # "all-bad": nothing of it went on


def test_replay_keeps_nothing_it_refuses_out_of_its_spill_and_its_batches(tmp_path):
    spill_dir, seen = tmp_path / "spill", {}

    async def main():
        transport = ZmqTransport()
        replay = ReplayActor(ReplayConfig(batch_episodes=2, capacity_episodes=8, spill_dir=str(spill_dir),
                                          vocab_size=100, max_row_tokens=64))
        topic = VERSION_TOPIC + b"main"
        async with (
            transport.open_publisher(capacity=64) as learner_versions,
            transport.open_receiver(capacity=4) as learner,
            trio.open_nursery() as nursery,
        ):
            addresses = await nursery.start(replay.run, transport, {"learner": [learner.address],
                                                                    "versions": [learner_versions.address]})
            frames = FrameCounter("learner")
            with trio.fail_after(30):
                while replay.statistics()["learner_version"] != 5:  # until the subscription takes effect
                    await learner_versions.publish(topic, frames.frame(Kind.VERSION,
                                                                       VersionAnnounced("main", 5).to_body()))
                    await trio.sleep(0.02)
            batches = Inbox(learner, Kind.BATCH, decode_batch)
            async with transport.open_sender([addresses["episodes"]]) as sender:
                out = Outbox(sender, Kind.EPISODES, "reward")
                await out.send(bad_middle_offset())
                for table in [*poisoned_episodes().values(),
                              episode("env-0-ahead", row(**{C.POLICY_VERSIONS: [5, 100 + VERSION_SLACK]})),
                              episode("env-0-near", row(**{C.POLICY_VERSIONS: [5, 5 + VERSION_SLACK]})),
                              episode("env-0-vocab", row(**{C.PROMPT_IDS: [100]})),
                              episode("env-0-long", row(**{C.PROMPT_IDS: [3] * 63})),  # 65 tokens, 1 over
                              episode("env-0-a"), episode("env-0-b")]:
                    await out.send(encode_table(table))
                with trio.fail_after(30):
                    seen["batches"] = [(await batches.receive())[0] for _ in range((len(POISON) + 3) // 2)]
            seen["stats"] = replay.statistics()
            nursery.cancel_scope.cancel()

    trio.run(main)
    stats, trained = seen["stats"], pa.concat_tables(seen["batches"])
    assert stats["streams"]["episodes"]["dropped_by_reason"] == {"bad_body": 1}
    assert stats["rejected_by_reason"] == {"null": 1, "missing_id": 1, "empty_prompt": 1, "no_action": 1, "ragged": 1,
                                           "too_long": 1, "token_id": 2, "non_finite": 1, "logprob": 1, "version": 2}
    assert stats["rejected_episodes"] == 3  # "ahead", "vocab" and "long": nothing left of them
    assert check_rows(trained, vocab_size=100, max_version=5 + VERSION_SLACK, max_tokens=64).rejected == {}
    assert trained.num_rows == len(POISON) + 1 + 2 + 2  # the honest turns of the poisoned episodes, "near", "a", "b"
    spilled, _ = Spill(str(spill_dir)).load()
    assert sorted(spilled) == sorted(set(trained.column(C.EPISODE_ID).to_pylist()))  # nothing else was spilled
    assert all(check_rows(t, vocab_size=100).rejected == {} for t in spilled.values())


def test_a_spill_written_before_the_checks_reloads_without_what_they_refuse(tmp_path):
    """A null episode id in the spill killed every restarted replay at its reload; now the row is refused there."""
    old = Spill(str(tmp_path))
    old.add_episode(episode("env-0-1"))
    old.add_episode(episode("x", {**row(), C.EPISODE_ID: None}))
    old.add_episode(episode("env-0-2", row(**{C.REWARD: math.inf}), row()))
    seen = {}

    async def main():
        transport = ZmqTransport()
        replay = ReplayActor(ReplayConfig(batch_episodes=2, capacity_episodes=4, spill_dir=str(tmp_path)))
        async with transport.open_receiver(capacity=4) as learner, trio.open_nursery() as nursery:
            await nursery.start(replay.run, transport, {"learner": [learner.address]})
            with trio.fail_after(30):
                seen["batch"], seq = await Inbox(learner, Kind.BATCH, decode_batch).receive()
            seen["stats"] = replay.statistics()
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert seen["stats"]["reloaded_episodes"] == 2 and seen["stats"]["rejected_by_reason"] == {"null": 1,
                                                                                               "non_finite": 1}
    assert seen["batch"].column(C.EPISODE_ID).to_pylist() == ["env-0-1", "env-0-1", "env-0-2"]


def test_a_rollout_refuses_a_prompt_outside_its_vocabulary_and_answers_the_next(tiny_model_dir):
    seen = {}

    async def main():
        transport = ZmqTransport()
        rollout = RolloutActor(RolloutConfig(model_path=str(tiny_model_dir), version_wait_s=1.0))
        async with transport.open_receiver() as completions, trio.open_nursery() as nursery:
            addresses = await nursery.start(rollout.run, transport, {})
            replies = Inbox(completions, Kind.COMPLETION, decode_completions)  # what is ready together comes together
            async with transport.open_sender([addresses["requests"]]) as requests:
                out = Outbox(requests, Kind.GENERATE, "env-0")
                # 4 asks for a version nobody announced: it waits on its own, and no longer than version_wait_s
                for request_id, prompt, min_version in [(4, [3, 4], 10**12), (1, [3, 10**6], 0), (2, [3, 4], -1),
                                                        (3, [3, 4], 0)]:
                    await out.send(GenerationRequest(request_id, completions.address, "main", prompt, 1.0, 2,
                                                     min_version).to_body())
                seen["answers"], seen["order"] = {}, []
                with trio.fail_after(60):
                    while len(seen["answers"]) < 4:
                        for c in await replies.receive():
                            seen["answers"][c.request_id] = c
                            seen["order"].append(c.request_id)
            seen["stats"] = rollout.statistics()
            nursery.cancel_scope.cancel()

    trio.run(main)
    answers, stats = seen["answers"], seen["stats"]
    assert "outside the vocabulary" in answers[1].error and not answers[1].token_ids
    assert "negative" in answers[2].error
    assert answers[3].error == "" and answers[3].token_ids  # the actor went on
    assert "waited 1 s for weights of version 1000000000000" in answers[4].error and seen["order"][-1] == 4
    assert stats["rejected_by_reason"] == {"token_id": 1, "version": 1} and stats["requests"] == 1
    assert stats["version_timeouts"] == 1


def test_a_league_result_whose_learner_holds_no_seat_is_never_journaled(tmp_path):
    members = [{"id": "main", "role": "main"}, {"id": "exploiter", "role": "main_exploiter"}]
    seen = {}

    async def main():
        transport = ZmqTransport()
        league = LeagueActor(LeagueConfig(members=members, state_dir=str(tmp_path)))
        async with trio.open_nursery() as nursery:
            addresses = await nursery.start(league.run, transport, {})
            async with transport.open_sender([addresses["results"]]) as sender:
                out = Outbox(sender, Kind.MATCH_RESULT, "env-0")
                for result in [MatchResult(0, "main", ["exploiter", "random"], [1.0, -1.0]),  # no seat
                               MatchResult(1, "ghost", ["ghost", "main"], [1.0, -1.0]),  # no member
                               MatchResult(2, "main", ["main", "exploiter"], [math.nan, 0.0]),
                               MatchResult(3, "main", ["main", "exploiter", "main"], [1.0, 0.0, 1.0]),
                               MatchResult(4, "main", ["main", "exploiter"], [1.0, -1.0])]:
                    await out.send(result.to_body())
                with trio.fail_after(30):
                    while league.statistics()["results"] < 1:  # progress poll: the good one is in
                        await trio.sleep(0.01)
            seen["stats"] = league.statistics()
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert seen["stats"]["rejected_by_reason"] == {"seatless_learner": 1, "unknown_learner": 1, "non_finite": 1,
                                                   "seats": 1}
    journal = [json.loads(line) for line in (tmp_path / JOURNAL_FILE).read_text().splitlines()]
    assert [entry[0] for entry in journal] == [4]
    assert LeagueActor(LeagueConfig(members=members, state_dir=str(tmp_path), resume=True)).table()["matches"] == 1


def test_a_league_resumes_past_a_journaled_result_it_cannot_use(tmp_path):
    """A journal written before results were checked: its seatless entry is skipped (counted) on every resume."""
    members = [{"id": "main", "role": "main"}]
    league = LeagueActor(LeagueConfig(members=members, state_dir=str(tmp_path)))
    league.record(MatchResult(0, "main", ["main", "random"], [1.0, -1.0]))
    league.save()
    with open(tmp_path / JOURNAL_FILE, "a") as journal:
        journal.write(json.dumps([1, "main", ["random", "random"], [1.0, -1.0], False]) + "\n")
        journal.write(json.dumps([2, "main", ["random", "main"], [-1.0, 1.0], False]) + "\n")
    again = LeagueActor(LeagueConfig(members=members, state_dir=str(tmp_path), resume=True))
    assert again.table()["matches"] == 2 and again.statistics()["rejected_by_reason"] == {"seatless_learner": 1}
    again.save()  # the skipped entry keeps its place: the next resume replays nothing twice
    again = LeagueActor(LeagueConfig(members=members, state_dir=str(tmp_path), resume=True))
    assert again.table()["matches"] == 2 and again.statistics()["rejected_by_reason"] == {}
