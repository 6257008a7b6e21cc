"""Many episodes' moves asked many to a frame, over real ZeroMQ sockets: every answer reaches the move that asked."""

import trio
from transformers import AutoTokenizer

from actors.rollout.scripted import serve_scripted
from actors.env.actor import EnvActor, EnvConfig
from actors.env.policy_client import GenerationRefused, open_policy_client
from streams.channels import MemoryTransport, ZmqTransport
from streams.endpoints import Inbox
from streams.messages import Completion
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
