"""The env actor against a scripted policy (a fake rollout actor on the same loop), over in-memory streams."""

import trio
from transformers import AutoTokenizer

from actors.endpoints import Inbox, Outbox
from actors.env import EnvActor, EnvConfig
from streams.channels import MemoryTransport
from streams.messages import Completion, GenerationRequest
from streams.schema import Columns, decode_table
from streams.wire import Kind


async def scripted_rollout(transport, receiver, tokenizer, answer: str, version: int = 5):
    """Answers every generation request with ``answer``, as version ``version`` of the policy."""
    inbox = Inbox(receiver, Kind.GENERATE, GenerationRequest.from_body)
    replies = {}
    async with trio.open_nursery() as nursery:
        while True:
            request = await inbox.receive()
            if request.reply_to not in replies:
                sender = await nursery.start(_open_sender, transport, request.reply_to)
                replies[request.reply_to] = Outbox(sender, Kind.COMPLETION, "scripted")
            tokens = tokenizer(answer)["input_ids"] + [tokenizer.eos_token_id]
            completion = Completion(request.request_id, tokens, [-0.5] * len(tokens), [version] * len(tokens), True)
            await replies[request.reply_to].send(completion.to_body())


async def _open_sender(transport, address, task_status=trio.TASK_STATUS_IGNORED):
    async with transport.open_sender([address]) as sender:
        task_status.started(sender)
        await trio.sleep_forever()


def run_episodes(tiny_model_dir, answer: str, episodes: int, **env_args) -> list:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tables = []

    async def main():
        transport = MemoryTransport()
        async with transport.open_receiver() as requests, transport.open_receiver() as rewards, \
                trio.open_nursery() as nursery:
            nursery.start_soon(scripted_rollout, transport, requests, tokenizer, answer)
            env = EnvActor(EnvConfig(tokenizer_path=str(tiny_model_dir), concurrency=4, **env_args))
            await nursery.start(env.run, transport, {"rollout": [requests.address], "reward": [rewards.address]})
            env.set_training(True)
            inbox = Inbox(rewards, Kind.EPISODES, decode_table)
            while len(tables) < episodes:
                tables.append(await inbox.receive())
            tables.append(env.statistics())
            nursery.cancel_scope.cancel()

    trio.run(main)
    return tables


def test_an_invalid_action_ends_the_episode_with_a_penalty_and_is_counted(tiny_model_dir):
    *episodes, stats = run_episodes(tiny_model_dir, "I play [1]", episodes=3)
    for table in episodes:
        rows = table.to_pylist()
        # X takes cell 1, then O answers [1] too: invalid, the game ends, O gets -1 and X 0
        assert [r[Columns.AGENT] for r in rows] == [0, 1]
        assert [r[Columns.INVALID_ACTION] for r in rows] == [False, True]
        assert [r[Columns.EPISODE_RETURN] for r in rows] == [0.0, -1.0]
        assert rows[1][Columns.REWARD] == -1.0 and rows[1][Columns.TERMINATED]
        assert all(r[Columns.POLICY_VERSIONS] == [5] * len(r[Columns.ACTION_IDS]) for r in rows)
        assert rows[0][Columns.ACTION_TEXT] == "I play [1]"
        assert {r[Columns.MATCHUP] for r in rows} == {"main,main"}
    assert stats["invalid_actions"] >= 3 and stats["errored"] == 0


def test_a_share_of_training_games_against_the_fixed_opponent(tiny_model_dir):
    *episodes, _ = run_episodes(tiny_model_dir, "[5]", episodes=40, opponent_share=1.0)
    for table in episodes:
        seats = set(table.column(Columns.AGENT).to_pylist())
        assert len(seats) == 1  # only the policy's seat has rows; the opponent is not trained on
        expected = "main,random" if seats == {0} else "random,main"
        assert set(table.column(Columns.MATCHUP).to_pylist()) == {expected}
    assert {next(iter(set(t.column(Columns.AGENT).to_pylist()))) for t in episodes} == {0, 1}


class FlakyTicTacToe:
    """TicTacToe whose every other game raises on its second move: an environment with a bug."""

    games = 0

    def __new__(cls, **kwargs):
        from envs.tictactoe import TicTacToe

        game = TicTacToe(**kwargs)
        FlakyTicTacToe.games += 1
        if FlakyTicTacToe.games % 2 == 0:
            step = game.step

            def failing_step(text):
                if game.moves == 1:
                    raise RuntimeError("the environment broke")
                return step(text)

            game.step = failing_step
        return game


def test_an_environment_that_raises_loses_its_episode_only(tiny_model_dir, monkeypatch):
    from envs import registry

    monkeypatch.setitem(registry.GAMES, "flaky", FlakyTicTacToe)
    *episodes, stats = run_episodes(tiny_model_dir, "[5]", episodes=6, env_name="flaky")
    assert len(episodes) == 6 and stats["errored"] >= 5  # the others kept going
