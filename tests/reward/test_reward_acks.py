"""The reward actor with a batching scorer, over real ZeroMQ sockets: an episode is acknowledged to its env actor
only once replay has it, so while a batch is held every episode not yet in replay is unacknowledged at the env
actor's sender, and a reward actor killed holding episodes has its successor sent them again."""

import trio

from actors.reward.actor import RewardActor, RewardConfig, receiver_capacity
from streams.channels import ZmqTransport
from streams.endpoints import Inbox, Outbox
from streams.schema import Columns as C
from streams.schema import decode_table, encode_table
from streams.wire import Kind
from tests.factories import turns_episode as episode
from tests.factories import QUIET_S, wait_in_flight


class HeldBatch:
    """A stub batching scorer: takes up to ``concurrency`` episodes at once and holds each until the test
    releases it by id (a judge's batch in the model), then passes it through."""

    concurrency = 4

    def __init__(self):
        self.held: dict[str, trio.Event] = {}

    async def score(self, table):
        name = table.column(C.EPISODE_ID)[0].as_py()
        self.held[name] = trio.Event()
        try:
            await self.held[name].wait()
        finally:
            del self.held[name]
        return table

    def release(self, *names: str) -> None:
        for name in names:
            self.held[name].set()

    def statistics(self) -> dict:
        return {}


async def wait_until(condition) -> None:
    with trio.fail_after(10):
        while not condition():
            await trio.sleep(0.01)


async def assert_unacknowledged_stays(sender, count: int) -> None:
    """The sender's unacknowledged count is ``count`` all the while it is watched (an acknowledgement would lower it)."""
    with trio.move_on_after(QUIET_S):
        while True:
            assert sender.statistics()["in_flight"] == count
            await trio.sleep(0.01)


async def start_cancellable(nursery, actor: RewardActor, transport, peers: dict) -> tuple[dict, trio.CancelScope]:
    scope = trio.CancelScope()

    async def run(task_status=trio.TASK_STATUS_IGNORED):
        with scope:
            await actor.run(transport, peers, task_status=task_status)

    return await nursery.start(run), scope


def test_a_batching_reward_actor_acknowledges_only_what_replay_has_and_a_killed_one_loses_nothing():
    names = [f"env-0-{i}" for i in range(6)]
    assert HeldBatch.concurrency < receiver_capacity(HeldBatch.concurrency)  # it holds less than a window

    async def main():
        transport = ZmqTransport()
        replayed: list[str] = []
        async with transport.open_receiver(capacity=16) as replay, trio.open_nursery() as nursery:
            inbox = Inbox(replay, Kind.EPISODES, decode_table)

            async def collect():
                while True:
                    replayed.append((await inbox.receive()).column(C.EPISODE_ID)[0].as_py())

            nursery.start_soon(collect)
            scorer, peers = HeldBatch(), {"replay": [replay.address]}
            addresses, first = await start_cancellable(nursery, RewardActor(RewardConfig(), scorer=scorer),
                                                       transport, peers)
            async with transport.open_sender([addresses["episodes"]]) as sender:
                out = Outbox(sender, Kind.EPISODES, "env-0")
                for name in names:
                    await out.send(encode_table(episode(name)))
                await wait_until(lambda: sorted(scorer.held) == names[:4])  # a batch held: none passed on
                await assert_unacknowledged_stays(sender, 6)

                scorer.release(names[1], names[2])  # passed on, but after 0, which is held: not acknowledged
                await wait_until(lambda: len(replayed) == 2 and sorted(scorer.held) == [names[i] for i in (0, 3, 4, 5)])
                scorer.release(names[3])  # the actor now waits for more, and acknowledges what it may: nothing
                await wait_until(lambda: len(replayed) == 3)
                await assert_unacknowledged_stays(sender, 6)

                scorer.release(names[0])  # 0 to 3 are in replay, 4 is held: acknowledged up to 4
                assert await wait_in_flight(sender, 6) == 2 == len(names) - len(replayed)
                assert sorted(replayed) == names[:4]

                first.cancel()  # killed holding 4 and 5
                await wait_until(lambda: not scorer.held)
                successor = ZmqTransport(rebind=[addresses["episodes"]])  # at its predecessor's address
                await start_cancellable(nursery, RewardActor(RewardConfig()), successor, peers)
                await wait_until(lambda: set(replayed) == set(names))  # 4 and 5 come again, and reach replay
                await wait_until(lambda: sender.statistics()["in_flight"] == 0)  # and are acknowledged
            nursery.cancel_scope.cancel()

    trio.run(main)
