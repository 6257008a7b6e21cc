"""Every kind of bad frame, over real sockets: dropped, counted by reason, and the stream goes on."""

import trio
import zmq

from streams.endpoints import Inbox
from streams.channels import ZmqTransport
from streams.messages import VERSION_TOPIC, VersionAnnounced
from streams.schema import decode_table
from streams.wire import FRAME_LIMITS, WIRE_VERSION, FrameCounter, Kind, LinkType, encode_link, pack
from tests.factories import assert_quiet


def header(kind: str = "version", v: int = WIRE_VERSION, seq: int = 0) -> bytes:
    return pack({"kind": kind, "v": v, "sender": "peer", "seq": seq})


GOOD = VersionAnnounced("main", 7).to_body()
BAD_FRAMES = {  # reason -> frames that must be dropped for it
    "malformed": [[b"\xc1", GOOD], [header()], [header(), GOOD, GOOD], [header()[:5], GOOD],
                  [pack({"kind": "version", "v": WIRE_VERSION}), GOOD]],
    "oversized": [[header(), b"\0" * (FRAME_LIMITS[Kind.VERSION] + 1)],
                  [header(), *[b"\0" * (FRAME_LIMITS[Kind.VERSION] // 2)] * 3]],  # every part counts
    "unknown_kind": [[header(kind="telepathy"), GOOD]],
    "wrong_version": [[header(v=WIRE_VERSION + 1), GOOD]],
    "wrong_kind": [[header(kind="completion"), GOOD]],
    "bad_body": [[header(), GOOD[:-3]], [header(), pack({"policy": "main", "version": "7"})],
                 [header(), pack({"policy": "main", "version": 7, "x": [[]] * 1000})]],  # a shape no version has
}


def test_each_kind_of_bad_frame_is_dropped_and_counted_and_the_next_good_one_arrives():
    async def test():
        transport = ZmqTransport()
        async with transport.open_receiver() as receiver:
            inbox = Inbox(receiver, Kind.VERSION, VersionAnnounced.from_body)
            peer = zmq.Context.instance().socket(zmq.DEALER)
            peer.connect(receiver.address)
            frames = [frame for bad in BAD_FRAMES.values() for frame in bad] + [[header(seq=1), GOOD]]
            for seq, frame in enumerate(frames):
                peer.send_multipart([encode_link(LinkType.DATA, seq), *frame])
            with trio.fail_after(10):
                assert await inbox.receive() == VersionAnnounced("main", 7)
            stats = inbox.statistics()
            assert stats["dropped_by_reason"] == {reason: len(bad) for reason, bad in BAD_FRAMES.items()}
            assert stats["rejected"] == stats["dropped_by_reason"]  # the link took every one of them
            assert stats["dropped_frames"] == len(frames) - 1 and stats["received"] == len(frames)
            peer.close(0)

    trio.run(test)


def test_a_bad_arrow_body_is_dropped():
    async def test():
        transport = ZmqTransport()
        async with transport.open_receiver() as receiver, transport.open_sender([receiver.address]) as sender:
            inbox = Inbox(receiver, Kind.EPISODES, decode_table)
            await sender.send(FrameCounter("env").frame(Kind.EPISODES, b"ARROW1 but not really"))
            with trio.move_on_after(0.5):
                await inbox.receive()
            assert inbox.statistics()["dropped_by_reason"] == {"bad_body": 1}

    trio.run(test)


def test_a_subscription_counts_the_frames_it_missed():
    async def test():
        transport = ZmqTransport()
        topic = VERSION_TOPIC + b"main"
        async with (
            transport.open_publisher(capacity=64) as publisher,
            transport.open_subscriber([publisher.address], [topic], capacity=64) as subscriber,
        ):
            inbox = Inbox(subscriber, Kind.VERSION, VersionAnnounced.from_body, topic=True)
            frames = FrameCounter("learner")
            for _ in range(200):  # until the subscription takes effect
                await publisher.publish(topic, frames.frame(Kind.VERSION, GOOD))
                with trio.move_on_after(0.05):
                    await inbox.receive()
                    break
            skipped = FrameCounter("learner")
            skipped.seq = frames.seq + 5  # five frames the subscriber never sees
            await publisher.publish(topic, skipped.frame(Kind.VERSION, GOOD))
            await inbox.receive()
            await assert_quiet(subscriber)
            assert inbox.statistics()["gaps"] == 5

    trio.run(test)
