"""Many episodes' moves asked many to a frame, over real ZeroMQ sockets: every answer reaches the move that asked."""

import pytest
import trio
import trio.testing
from transformers import AutoTokenizer

from actors.rollout.scripted import serve_scripted
from actors.env.actor import EnvActor, EnvConfig
from actors.env.policy_client import CompletionLost, GenerationRefused, open_policy_client
from streams.channels import MemoryTransport, ZmqTransport
from streams.endpoints import Inbox, Outbox
from streams.messages import Completion, decode_requests, encode_completions
from streams.schema import Columns, decode_table
from streams.wire import Kind


def echo(eos: int):
    """The scripted rule: the prompt's last two ids, reversed, and EOS; a version of the request's id (mod 1000)."""
    def reply(request):
        tokens = [request.prompt_ids[-1], request.prompt_ids[-2], eos]
        return Completion(request.request_id, tokens, [-0.5] * 3, [request.request_id % 1000] * 3, True)
    return reply


def test_many_episodes_ask_together_and_every_answer_reaches_its_own_move(tiny_model_dir):
    eos = AutoTokenizer.from_pretrained(tiny_model_dir).eos_token_id
    tables, seen = [], {}

    async def main():
        transport = ZmqTransport()
        async with transport.open_receiver(capacity=256) as requests, transport.open_receiver() as rewards, \
                trio.open_nursery() as nursery:
            nursery.start_soon(serve_scripted, transport, requests, echo(eos))
            env = EnvActor(EnvConfig(tokenizer_path=str(tiny_model_dir), concurrency=48, batch_episodes=10**6))
            await nursery.start(env.run, transport, {"rollout": [requests.address], "reward": [rewards.address]})
            env.set_training(True)
            inbox = Inbox(rewards, Kind.EPISODES, decode_table)
            with trio.fail_after(60):
                while len(tables) < 120:
                    tables.append(await inbox.receive())
            seen["stats"] = env.statistics()
            nursery.cancel_scope.cancel()

    trio.run(main)
    stats = seen["stats"]
    rows = [row for table in tables for row in table.to_pylist()]
    assert rows and all(row[Columns.ACTION_IDS] == [row[Columns.PROMPT_IDS][-1], row[Columns.PROMPT_IDS][-2], eos]
                        for row in rows)  # each move got the answer to its own prompt
    assert len({row[Columns.EPISODE_ID] for row in rows}) == len(tables)  # one frame an episode, none twice
    assert stats["errored"] == 0 and stats["duplicate_completions"] == 0
    assert stats["request_frames"] * 4 < stats["turns"]  # many requests a frame
    assert stats["completion_frames"] <= stats["request_frames"]


def test_a_prompt_no_rollout_could_take_drops_its_episode_before_anything_is_sent():
    async def main():
        transport = MemoryTransport()
        async with transport.open_receiver() as requests, \
                open_policy_client(transport, {"main": [requests.address]}, name="env", own="main", temperature=1.0,
                                   min_version=lambda policy: 0) as client:
            for prompt, budget in [([], 4), ([1, 2], 0)]:
                try:
                    await client.generate(prompt, budget, "main")
                except GenerationRefused as refused:
                    assert "1 to" in str(refused)
                else:
                    raise AssertionError("no refusal")
            await trio.sleep(0.01)
            return client.statistics()

    stats = trio.run(main)
    assert stats["request_frames"] == 0 and stats["live_episodes"] == 0



async def serve_lossy(transport, receiver, reply) -> None:
    """A scripted rollout whose completions can be lost: ``reply(request)`` answers a request, or returns None and
    nothing goes back (a reply the rollout dropped: its destination's queue full, its deadline passed)."""
    inbox, outboxes = Inbox(receiver, Kind.GENERATE, decode_requests), {}
    async with trio.open_nursery() as nursery:
        while True:
            for request in await inbox.receive():
                completion = reply(request)
                if completion is None:
                    continue
                if request.reply_to not in outboxes:
                    sender = await nursery.start(_open_sender, transport, request.reply_to)
                    outboxes[request.reply_to] = Outbox(sender, Kind.COMPLETION, "lossy")
                await outboxes[request.reply_to].send(encode_completions([completion]))


async def _open_sender(transport, address, task_status=trio.TASK_STATUS_IGNORED):
    async with transport.open_sender([address], capacity=64) as sender:
        task_status.started(sender)
        await trio.sleep_forever()


def test_a_request_unanswered_past_its_deadline_is_sent_again_once_then_its_move_is_given_up():
    """A completion lost on its way back is never said to be lost: the request is sent again after its deadline,
    and once more unanswered its move raises ``CompletionLost`` rather than wait (and hold admission) for ever."""
    asked = []

    def second_ask_of_the_first(request):
        asked.append(request.request_id)
        if asked.count(request.request_id) == 2 and list(request.prompt_ids) == [1, 2]:
            return Completion(request.request_id, [7, 8], [-0.5] * 2, [0] * 2, True)
        return None

    async def main():
        transport = MemoryTransport()
        async with transport.open_receiver() as requests, trio.open_nursery() as nursery, \
                open_policy_client(transport, {"main": [requests.address]}, name="env", own="main", temperature=1.0,
                                   min_version=lambda policy: 0, request_deadline_s=10.0) as client:
            nursery.start_soon(serve_lossy, transport, requests, second_ask_of_the_first)
            with trio.fail_after(1000):  # virtual time: without a deadline the move waits for ever
                completion = await client.generate([1, 2], 4, "main")  # lost once, answered when sent again
                start = trio.current_time()
                with pytest.raises(CompletionLost, match="unanswered for twice its deadline of 10 s"):
                    await client.generate([2, 3], 4, "main")  # lost twice
                waited = trio.current_time() - start
            stats = client.statistics()
            nursery.cancel_scope.cancel()
        return completion, waited, stats

    completion, waited, stats = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert list(completion.token_ids) == [7, 8] and waited == pytest.approx(20.0)  # two deadlines, then given up
    assert len(asked) == 4 and len(set(asked)) == 2 and stats["reissued_requests"] == 2
    assert stats["live_episodes"] == 0  # nothing left waiting


def test_an_episode_whose_completion_is_lost_gives_its_admission_back(tiny_model_dir):
    """At max_staleness 0 and B = 2 the env actor may have 2 episodes started; the rollout loses every answer to the
    first request. Its episode is dropped after two deadlines, counted, and its place goes to a new episode (without
    the deadline it held the place for ever, and a second episode never came)."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    move = tokenizer("[5]")["input_ids"] + [tokenizer.eos_token_id]
    first = []

    def lose_the_first(request):
        first[:] = first or [request.request_id]
        if request.request_id == first[0]:
            return None
        return Completion(request.request_id, move, [-0.5] * len(move), [0] * len(move), True)

    async def main():
        transport = MemoryTransport()
        async with transport.open_receiver() as requests, transport.open_receiver() as rewards, \
                trio.open_nursery() as nursery:
            nursery.start_soon(serve_lossy, transport, requests, lose_the_first)
            env = EnvActor(EnvConfig(tokenizer_path=str(tiny_model_dir), concurrency=2, max_staleness=0,
                                     batch_episodes=2, request_deadline_s=5.0))
            await nursery.start(env.run, transport, {"rollout": [requests.address], "reward": [rewards.address]})
            env.set_training(True)
            inbox = Inbox(rewards, Kind.EPISODES, decode_table)
            with trio.fail_after(1000):
                delivered = [await inbox.receive() for _ in range(2)]
            stats = env.statistics()
            nursery.cancel_scope.cancel()
        return delivered, stats

    delivered, stats = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert len(delivered) == 2 and stats["lost_completions"] == 1 and stats["errored"] == 1
    assert stats["given_back_by_reason"] == {"errored": 1} and stats["started"] == 2
