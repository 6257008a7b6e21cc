"""Both transports, same tests. ZeroMQ runs on the real clock (its I/O happens in libzmq's threads);
the memory transport on trio's MockClock, so its timeouts cost nothing."""

import pytest
import trio
import trio.testing

from streams.channels import MemoryTransport, ZmqTransport

TRANSPORTS = {"zmq": ZmqTransport, "memory": MemoryTransport}
BLOCKED_S = 0.25  # a send that has not finished after this long counts as blocked
PAYLOAD = 256 * 2**10  # large messages, so that the kernel's TCP buffers fill quickly


@pytest.fixture(params=list(TRANSPORTS))
def run(request):
    """Runs `async def test(transport)` on a fresh transport of each kind."""
    transport = TRANSPORTS[request.param]()
    clock = trio.testing.MockClock(autojump_threshold=0) if request.param == "memory" else None
    return lambda test: trio.run(test, transport, clock=clock)


async def send_numbered(sender, name: bytes, count: int) -> None:
    for i in range(count):
        await sender.send([name, str(i).encode()])


def test_two_senders_deliver_every_message_exactly_once(run):
    async def test(transport):
        async with transport.open_receiver() as receiver:
            async with (
                transport.open_sender([receiver.address]) as a,
                transport.open_sender([receiver.address]) as b,
                trio.open_nursery() as nursery,
            ):
                nursery.start_soon(send_numbered, a, b"a", 500)
                nursery.start_soon(send_numbered, b, b"b", 500)
                got = [await receiver.receive() for _ in range(1000)]
            assert a.statistics()["sent"] == b.statistics()["sent"] == 500
        assert receiver.statistics()["received"] == 1000
        for name in (b"a", b"b"):  # all of them, once each, in order per sender
            assert [n for who, n in got if who == name] == [str(i).encode() for i in range(500)]

    run(test)


def test_sender_round_robins_across_receivers(run):
    async def test(transport):
        async with transport.open_receiver() as r1, transport.open_receiver() as r2:
            async with transport.open_sender([r1.address, r2.address]) as sender:
                await send_numbered(sender, b"m", 10)
                first = [(await r1.receive())[1] for _ in range(5)]
                second = [(await r2.receive())[1] for _ in range(5)]
        numbers = sorted(int(n) for n in first + second)
        assert numbers == list(range(10))
        assert {int(n) % 2 for n in first} in ({0}, {1})  # strictly alternating

    run(test)


def test_sender_connected_later_is_served(run):
    async def test(transport):
        async with transport.open_receiver() as receiver, transport.open_sender() as sender:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(sender.send, [b"early"])  # no receiver yet: it waits
                await trio.testing.wait_all_tasks_blocked()
                sender.connect(receiver.address)
            assert await receiver.receive() == [b"early"]

    run(test)


def test_backpressure_blocks_the_sender_and_loses_nothing(run):
    async def test(transport):
        async with transport.open_receiver(capacity=2) as receiver:
            async with transport.open_sender([receiver.address], capacity=2) as sender:
                sent = await send_until_blocked(sender, limit=400)
                assert sent < 400, "send never waited for the receiver"
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(sender.send, message(sent))  # blocks until we read
                    for i in range(sent + 1):
                        assert bytes((await receiver.receive())[0]) == message(i)[0]
                assert sender.statistics()["sent"] == sent + 1
                assert sender.statistics()["send_waits"] >= 1
                await assert_nothing_more(receiver)  # the cancelled send did not go out

    run(test)


async def assert_nothing_more(receiver) -> None:
    with trio.move_on_after(BLOCKED_S):
        extra = await receiver.receive()
        raise AssertionError(f"unexpected message {bytes(extra[0])[:8]!r}")


def test_tasks_can_share_a_sender(run):
    async def test(transport):
        async with (
            transport.open_receiver(capacity=2) as receiver,
            transport.open_sender([receiver.address], capacity=2) as sender,
            trio.open_nursery() as nursery,
        ):
            for task in range(8):
                nursery.start_soon(send_numbered, sender, b"task-%d" % task, 100)
            got = sorted([tuple(await receiver.receive()) for _ in range(800)])
            await assert_nothing_more(receiver)
        expected = sorted((b"task-%d" % task, str(i).encode()) for task in range(8) for i in range(100))
        assert got == expected

    run(test)


def message(i: int) -> list[bytes]:
    return [i.to_bytes(4, "big") * (PAYLOAD // 4)]


async def send_until_blocked(sender, limit: int) -> int:
    for i in range(limit):
        with trio.move_on_after(BLOCKED_S) as scope:
            await sender.send(message(i))
        if scope.cancelled_caught:
            return i
    return limit


async def subscribe(publisher, subscriber, topic: bytes) -> None:
    """Publish probes until one arrives: a ZeroMQ subscription takes effect some time after connecting."""
    for _ in range(200):
        await publisher.publish(topic, [b"probe"])
        with trio.move_on_after(0.05):
            assert await subscriber.receive() == [topic, b"probe"]
            return
    raise AssertionError("subscription never took effect")


async def receive_skipping_probes(subscriber) -> list[bytes]:
    while (parts := await subscriber.receive())[1:] == [b"probe"]:
        pass
    return parts


def test_pub_sub_delivers_to_every_subscriber_by_topic(run):
    async def test(transport):
        async with (
            transport.open_publisher(capacity=16) as publisher,
            transport.open_subscriber([publisher.address], [b"weights"], capacity=16) as weights,
            transport.open_subscriber([publisher.address], [b"version", b"weights/main"], capacity=16) as both,
        ):
            await subscribe(publisher, weights, b"weights")
            await subscribe(publisher, both, b"version")
            for topic, body in [(b"other", b"x"), (b"weights/main", b"w1"), (b"version", b"v1")]:
                await publisher.publish(topic, [body])
            assert await receive_skipping_probes(weights) == [b"weights/main", b"w1"]
            assert await receive_skipping_probes(both) == [b"weights/main", b"w1"]
            assert await receive_skipping_probes(both) == [b"version", b"v1"]
            assert publisher.statistics()["sent"] >= 5

    run(test)


def test_memory_publisher_counts_drops_for_a_full_subscriber():
    async def test():
        transport = MemoryTransport()
        async with transport.open_publisher() as publisher, transport.open_subscriber(capacity=2) as subscriber:
            subscriber.connect(publisher.address)
            for version in range(5):
                await publisher.publish(b"version", [bytes([version])])
            assert publisher.statistics()["dropped"] == 3
            assert [await subscriber.receive() for _ in range(2)] == [[b"version", b"\x00"], [b"version", b"\x01"]]

    trio.run(test)


def test_memory_sender_may_connect_before_the_receiver_binds():
    async def test():
        transport = MemoryTransport()
        async with transport.open_sender(["mem://learner"]) as sender:
            await sender.send([b"queued"])
            async with transport.open_receiver(address="mem://learner") as receiver:
                assert await receiver.receive() == [b"queued"]

    trio.run(test)


def test_large_parts_arrive_as_read_only_views(run):
    async def test(transport):
        async with transport.open_receiver() as receiver, transport.open_sender([receiver.address]) as sender:
            await sender.send([b"small", b"L" * PAYLOAD])
            small, large = await receiver.receive()
        assert small == b"small" and isinstance(small, bytes)
        assert isinstance(large, memoryview) and large.readonly and large == b"L" * PAYLOAD

    run(test)


def test_an_explicit_done_receiver_hands_tokens_and_its_inbox_drops_bad_frames_as_done(run):
    from streams.endpoints import Inbox
    from streams.wire import FrameCounter, Kind

    async def test(transport):
        with pytest.raises(ValueError, match="explicit"):
            async with transport.open_receiver(ack_when_done="later"):
                pass
        async with (
            transport.open_receiver(ack_when_done="explicit") as receiver,
            transport.open_sender([receiver.address]) as sender,
        ):
            assert receiver.explicit
            frames = FrameCounter("env")
            await sender.send([b"not a frame"])
            for body in (b"one", b"two"):
                await sender.send(frames.frame(Kind.EPISODES, body))
            inbox = Inbox(receiver, Kind.EPISODES, bytes)
            with trio.fail_after(10):
                (first, one), (second, two) = await inbox.receive(), await inbox.receive()
            assert (first, second) == (b"one", b"two") and one != two
            assert inbox.statistics()["dropped_frames"] == 1
            inbox.done(two)  # in any order
            inbox.done(one)
            if transport.__class__ is ZmqTransport:  # the dropped frame was done by the inbox: nothing is held
                assert receiver.statistics()["held"] == 0
                with trio.fail_after(10):
                    await sender.drain()
                assert sender.statistics()["in_flight"] == 0

    run(test)
