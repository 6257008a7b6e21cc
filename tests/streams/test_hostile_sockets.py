"""Hostile peers over real ZeroMQ sockets: a receiver never raises, its memory is bounded, replies never stall."""

import time

import pytest
import trio
import zmq

import streams.zmq_receiver
from streams.channels import ZmqTransport
from streams.endpoints import Inbox
from streams.messages import GenerationRequest, VersionAnnounced
from streams.replies import open_replies
from streams.wire import FRAME_LIMITS, LINK_BYTES, FrameCounter, Kind, LinkType, encode_link, pack
from streams.zmq_channels import HWM_SLACK, sender_hwm
from tests.factories import assert_quiet

GOOD = VersionAnnounced("main", 7).to_body()


def raw_socket(address: str, kind: int = zmq.DEALER) -> zmq.Socket:
    peer = zmq.Context.instance().socket(kind)
    peer.setsockopt(zmq.LINGER, 0)
    peer.connect(address)
    return peer


def version(i: int) -> list[bytes]:
    return FrameCounter("learner").frame(Kind.VERSION, VersionAnnounced("main", i).to_body())


def test_sequence_numbers_outside_the_window_are_rejected_and_the_receiver_serves_on():
    """A link sequence number of 2**64-1 made the next acknowledgement overflow (struct.error out of receive)."""
    async def test():
        transport = ZmqTransport()
        async with transport.open_receiver(capacity=8) as receiver, transport.open_sender([receiver.address]) as honest:
            inbox = Inbox(receiver, Kind.VERSION, VersionAnnounced.from_body)
            frames = FrameCounter("hostile")
            first = raw_socket(receiver.address)  # its first message: the largest sequence number there is
            first.send_multipart([encode_link(LinkType.DATA, 2**64 - 1), *frames.frame(Kind.VERSION, GOOD)])
            later = raw_socket(receiver.address)  # a fair start, then far ahead of its window, then just past it
            for seq in (0, 2**64 - 1, 2**63, 1 + 8):
                later.send_multipart([encode_link(LinkType.DATA, seq), *frames.frame(Kind.VERSION, GOOD)])
            with trio.fail_after(10):
                assert await inbox.receive() == VersionAnnounced("main", 7)  # `later`'s seq 0
                for i in range(20):  # acknowledgements go out (every half window): none overflows
                    await honest.send(version(i))
                    while (await inbox.receive()).version != i:
                        pass
                while receiver.statistics()["rejected"].get("out_of_window", 0) < 4:  # `first` may connect last
                    with trio.move_on_after(0.05):
                        raise AssertionError(f"unexpected {await inbox.receive()!r}")
                async with trio.open_nursery() as nursery:  # a receiver acknowledges the rest once it waits
                    async def drain():
                        await honest.drain()
                        nursery.cancel_scope.cancel()
                    nursery.start_soon(drain)
                    raise AssertionError(f"unexpected {await inbox.receive()!r}")
            assert receiver.statistics()["rejected"] == {"out_of_window": 4}
            assert inbox.statistics()["rejected"]["out_of_window"] == 4
            first.close()
            later.close()

    trio.run(test)


def test_every_error_in_a_receive_path_is_a_rejection_counted_by_reason(monkeypatch):
    """Off-protocol messages, too large ones, and a failure inside the receiver itself: counted, never raised."""
    real_decode = streams.zmq_receiver.decode_link

    def decode_link(buf):
        if bytes(buf[:4]) == b"boom":
            raise RuntimeError("a bug the input found")
        return real_decode(buf)

    monkeypatch.setattr(streams.zmq_receiver, "decode_link", decode_link)

    async def test():
        transport = ZmqTransport()
        async with transport.open_receiver(max_message_bytes=1000) as receiver, \
                transport.open_sender([receiver.address]) as honest:
            peer = raw_socket(receiver.address)
            link = [encode_link(LinkType.DATA, seq) for seq in range(3)]
            peer.send_multipart([b"no envelope"])  # bad_link
            peer.send_multipart([encode_link(LinkType.ACK, 0), b"body"])  # bad_link: an ack where data belongs
            peer.send_multipart([b"boom" + link[0][4:], b"body"])  # receive_error
            peer.send_multipart([link[0]])  # bad_link: an envelope, no body (its sequence number is taken)
            peer.send_multipart([link[1], b"x" * 600, b"y" * 600])  # oversized: its parts together, each under 1000
            peer.send_multipart([link[2], b"fits"])  # the same peer goes on
            await honest.send([b"honest"])
            with trio.fail_after(10):
                got = {bytes((await receiver.receive())[0]) for _ in range(2)}
            await assert_quiet(receiver)
            assert got == {b"fits", b"honest"}
            assert receiver.statistics()["rejected"] == {"bad_link": 3, "receive_error": 1, "oversized": 1}
            assert receiver.statistics()["dropped"] == 5
            peer.close()

    trio.run(test)


def test_what_a_hostile_receiver_sends_back_never_stops_a_sender():
    """A sender reads acknowledgements from whatever it connected to (a request's reply_to names it)."""
    async def test():
        hostile = zmq.Context.instance().socket(zmq.ROUTER)
        hostile.setsockopt(zmq.LINGER, 0)
        address = f"tcp://127.0.0.1:{hostile.bind_to_random_port('tcp://127.0.0.1')}"
        transport = ZmqTransport()
        async with transport.open_sender([address], capacity=4) as sender:
            await sender.send([b"hello"])
            with trio.fail_after(10):
                while not hostile.poll(0):
                    await trio.sleep(0.01)
            identity = hostile.recv_multipart()[0]
            for reply in ([b"x"], [b"x" * LINK_BYTES], [encode_link(LinkType.DATA, 0)],
                          [encode_link(LinkType.ACK, 2**64 - 1, 2**32 - 1), b"extra"]):
                hostile.send_multipart([identity, *reply])
            with trio.fail_after(10):
                while sender.statistics()["rejected"].get("bad_link", 0) < 4:
                    await trio.sleep(0.01)
            hostile.send_multipart([identity, encode_link(LinkType.ACK, 1, 4)])  # a real acknowledgement still counts
            with trio.fail_after(10):
                await sender.drain()
        hostile.close()

    trio.run(test)


def test_a_four_mib_request_is_refused_by_its_size_not_parsed_and_parts_count_together():
    async def test():
        transport = ZmqTransport()
        async with transport.open_receiver(capacity=16) as receiver, transport.open_sender([receiver.address]) as out:
            inbox = Inbox(receiver, Kind.GENERATE, GenerationRequest.from_body)
            header = pack({"kind": "generate", "v": 1, "sender": "env", "seq": 0})
            empties = pack({"id": 1, "x": [[]] * (4 * 2**20 - 64)})  # 4 MiB that unpack into 4 M lists
            half = FRAME_LIMITS[Kind.GENERATE] // 2 + 1
            await out.send([header, empties])
            await out.send([header, b"\0" * half, b"\0" * half])  # each part under the limit, together over it
            await out.send(FrameCounter("env").frame(Kind.GENERATE, GenerationRequest(
                2, "tcp://127.0.0.1:9", "main", [1, 2], 1.0, 4).to_body()))
            started = time.perf_counter()
            with trio.fail_after(10):
                assert (await inbox.receive()).request_id == 2
            elapsed = time.perf_counter() - started
            rejected = inbox.statistics()["rejected"]
            rejected.pop("wrong_kind", None)  # a stray sender of an earlier test on a reused port: refused too
            assert rejected == {"oversized": 2}
            assert elapsed < 2.0, f"refusing took {elapsed:.2f} s: was it parsed?"  # parsing it took 4 s

    trio.run(test)


def test_high_water_marks_bound_what_a_peer_ignoring_the_credits_can_queue():
    """A receiver that is not reading stops taking from a peer that ignores its window (TCP holds it back)."""
    async def test():
        transport = ZmqTransport()
        async with transport.open_receiver(capacity=8) as receiver, transport.open_sender([receiver.address]) as out:
            await out.send([b"x"])
            link = out._links[receiver.address]
            while link.sock is None:
                await trio.sleep(0.01)
            for sock, (option, expected) in [(receiver._sock.socket, (zmq.RCVHWM, 8 + HWM_SLACK)),
                                             (receiver._sock.socket, (zmq.SNDHWM, 8 + HWM_SLACK)),
                                             (link.sock.socket, (zmq.SNDHWM, sender_hwm(64)))]:
                assert sock.getsockopt(option) == expected
            flood = raw_socket(receiver.address)
            flood.setsockopt(zmq.SNDHWM, 1)
            part, sent = b"\0" * 2**16, 0
            while sent < 2000:  # 125 MiB if nothing held it back
                try:
                    flood.send_multipart([encode_link(LinkType.DATA, sent), part], zmq.NOBLOCK)
                    sent += 1
                except zmq.Again:
                    if not flood.poll(500, zmq.POLLOUT):  # held back: the receiver's queue and TCP's are full
                        break
            assert sent < 1000, f"{sent} messages of 64 KiB taken by a receiver that reads nothing"
            flood.close()

    trio.run(test)


@pytest.mark.parametrize("address", ["ipc:///tmp/anything", "tcp://example.com:80", "tcp://10.1.2.3:5555",
                                     "tcp://127.0.0.1:x", "tcp://0.0.0.0:5555", "tcp://127.0.0.1:5;127.0.0.1:6"])
def test_replies_go_only_to_stream_addresses_of_this_run(address):
    async def test():
        async with open_replies(ZmqTransport(), Kind.COMPLETION, "rollout") as replies:
            assert not replies.post(address, b"body")
            assert replies.statistics()["rejected"] == {"bad_address": 1}

    trio.run(test)


def test_a_reply_address_that_never_acknowledges_stalls_only_itself():
    """Replies to a silent destination are dropped after the deadline (counted); an honest one gets every reply."""
    async def test():
        silent = zmq.Context.instance().socket(zmq.ROUTER)  # takes the connection, never acknowledges
        silent.setsockopt(zmq.LINGER, 0)
        silent_address = f"tcp://127.0.0.1:{silent.bind_to_random_port('tcp://127.0.0.1')}"
        transport = ZmqTransport()
        got = []

        async def take(inbox):  # as an actor does: always asking for the next (which acknowledges)
            while True:
                got.append(await inbox.receive())

        async with transport.open_receiver(capacity=64) as honest, trio.open_nursery() as nursery, \
                open_replies(transport, Kind.COMPLETION, "rollout", window=4, deadline_s=0.5) as replies:
            nursery.start_soon(take, Inbox(honest, Kind.COMPLETION, lambda body: bytes(body)))
            for i in range(20):  # five windows to the silent one, interleaved with the honest one's
                assert replies.post(silent_address, b"lost %d" % i)
                assert replies.post(honest.address, b"reply %d" % i)
            with trio.fail_after(5):
                while len(got) < 20:
                    await trio.sleep(0.01)
            assert got == [b"reply %d" % i for i in range(20)]
            with trio.fail_after(10):
                while replies.statistics()["destinations"] > 1:  # the silent one is given up after its deadline
                    await trio.sleep(0.05)
            assert replies.statistics()["rejected"] == {"deadline": 20}
            assert replies.post(honest.address, b"after")
            with trio.fail_after(5):
                while len(got) < 21:
                    await trio.sleep(0.01)
            assert got[-1] == b"after" and replies.statistics()["rejected"] == {"deadline": 20}
            nursery.cancel_scope.cancel()
        silent.close()

    trio.run(test)


def test_the_fuzzer_accounts_for_every_frame_and_every_actor_still_serves(tiny_model_dir, tmp_path):
    """The stream benchmark (`benchmarks/stream_bench.py`) reported `actors still serving: False`: its reward actor
    sent to a sink that never acknowledged, and a reward actor counts an episode scored only once replay has
    acknowledged it, so the check's episode was held, never scored. Wired reward -> replay -> learner, every actor
    is seen to serve (or not)."""
    from tests.support.stream_fuzz import Fuzzer

    result = Fuzzer(20, str(tmp_path)).run(str(tiny_model_dir))
    assert result["serving"] == dict.fromkeys(["rollout.manifest", "rollout.min_version", "rollout",
                                               "reward->replay->learner", "learner.fetch", "league", "env"], True)
    assert result["frames"] == 200 and result["crashes"] == 0


def test_the_league_and_the_weights_server_answer_only_addresses_they_may_connect_to(tmp_path):
    """A league match request and a weights fetch name their ``reply_to``: one the transport may not connect to is
    dropped and counted, and the next honest request is answered."""
    from actors.league.actor import LeagueActor, LeagueConfig
    from streams.endpoints import Outbox
    from streams.messages import MatchAssigned, MatchRequest, WeightsChunk, WeightsFetch
    from streams.weights import WeightsPublisher

    async def test():
        transport = ZmqTransport()
        members = [{"id": "main", "role": "main"}]
        league = LeagueActor(LeagueConfig(members=members, state_dir=str(tmp_path / "league")))
        async with (
            transport.open_receiver() as matches,
            transport.open_receiver() as chunks,
            transport.open_receiver() as fetches,
            transport.open_publisher(capacity=4) as publisher,
            trio.open_nursery() as nursery,
        ):
            addresses = await nursery.start(league.run, transport, {})
            weights = WeightsPublisher("learner", "main", Outbox(publisher, Kind.WEIGHTS, "learner", topic=b"w"), fetches.address,
                                       directory=str(tmp_path), chunk_bytes=1000)
            nursery.start_soon(weights.serve_chunks, Inbox(fetches, Kind.WEIGHTS_FETCH, WeightsFetch.from_body),
                               transport)
            await weights.publish(1, b"w" * 2500)
            async with (transport.open_sender([addresses["requests"]]) as to_league,
                        transport.open_sender([fetches.address]) as to_weights):
                league_out = Outbox(to_league, Kind.MATCH_REQUEST, "env-0")
                weights_out = Outbox(to_weights, Kind.WEIGHTS_FETCH, "rollout-0")
                for request_id, (match_to, chunk_to) in enumerate([("tcp://example.com:80", "tcp://10.1.2.3:5555"),
                                                                     (matches.address, chunks.address)]):
                    await league_out.send(MatchRequest(request_id, match_to, ["main"]).to_body())
                    await weights_out.send(WeightsFetch("main", 1, 2, chunk_to).to_body())
                with trio.fail_after(30):
                    match = await Inbox(matches, Kind.MATCH, MatchAssigned.from_body).receive()
                    chunk = await Inbox(chunks, Kind.WEIGHTS_CHUNK, WeightsChunk.from_body).receive()
                assert match.request_id == 1 and (chunk.index, chunk.data) == (2, b"w" * 500)
            assert league.statistics()["replies"]["rejected"] == {"bad_address": 1}
            assert weights.statistics()["replies"]["rejected"] == {"bad_address": 1}
            weights.close()
            nursery.cancel_scope.cancel()

    trio.run(test)
