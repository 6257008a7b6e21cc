"""Closed doors on one host: a run's streams are Unix sockets in a private directory (``ZmqTransport(ipc_dir=...)``),
which no other user can connect to nor bind in; a restarted endpoint binds its address again, but never over a
socket that still listens there; replies go only to sockets of that directory; a receiver takes no part larger than
its kind's frames."""

import os
import socket
import stat

import pytest
import trio
import zmq

import streams.zmq_socket
from streams.channels import ZmqTransport
from streams.endpoints import Inbox
from streams.messages import MatchRequest
from streams.private_files import SOCKET_ROOT, private_dir, remove_private_dir
from streams.replies import open_replies
from streams.wire import FRAME_LIMITS, FrameCounter, Kind, LinkType, encode_link
from tests.factories import assert_quiet

NOBODY = 65534


@pytest.fixture
def ipc_dir():
    directory = private_dir(SOCKET_ROOT, "test")  # a short path: a Unix socket's is at most 107 bytes
    yield str(directory)
    remove_private_dir(directory)


def as_stranger(attempts) -> list[str]:
    """Run each of ``attempts`` (functions that raise OSError or not) in a child process of another user, nobody;
    the outcome of each: "ok" or the error's name."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child does nothing but system calls, then ends without cleanup
        try:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            outcomes = []
            for attempt in attempts:
                try:
                    attempt()
                    outcomes.append("ok")
                except OSError as error:
                    outcomes.append(type(error).__name__)
            os.write(write, " ".join(outcomes).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        outcomes = pipe.read().split()
    os.waitpid(pid, 0)
    return outcomes


def unix_connect(path: str) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.connect(path)


def unix_bind(path: str) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as squatter:
        squatter.bind(path)
        squatter.listen()


def test_a_run_on_one_host_binds_unix_sockets_in_its_private_directory_that_no_other_user_may_reach(ipc_dir):
    """Old finding 6: on loopback TCP any local user could send episodes or batches, or bind a restarting actor's
    port and take what its senders resent. In a 0700 directory another user can neither connect nor bind."""
    if os.getuid() != 0:
        pytest.skip("acting as another user needs root")

    async def test():
        transport = ZmqTransport(ipc_dir=ipc_dir)
        async with transport.open_receiver(capacity=4) as receiver, \
                transport.open_sender([receiver.address]) as sender:
            path = receiver.address.removeprefix("ipc://")
            assert os.path.dirname(path) == ipc_dir and stat.S_ISSOCK(os.lstat(path).st_mode)
            assert stat.S_IMODE(os.stat(ipc_dir).st_mode) == 0o700
            beside = os.path.join(ipc_dir, "0123456789abcdef")
            assert as_stranger([lambda: unix_connect(path), lambda: unix_bind(beside)]) == ["PermissionError"] * 2
            assert as_stranger([lambda: unix_connect(SOCKET_ROOT)]) != ["PermissionError"]  # the check can fail
            await sender.send([b"honest"])
            with trio.fail_after(10):
                assert await receiver.receive() == [b"honest"]

    trio.run(test)


def test_a_directory_other_users_may_enter_is_refused(tmp_path):
    open_dir = tmp_path / "streams"
    open_dir.mkdir(mode=0o755)
    os.chmod(open_dir, 0o755)
    with pytest.raises(PermissionError, match="chmod 700"):
        ZmqTransport(ipc_dir=open_dir)


def test_a_local_cluster_over_zeromq_binds_in_a_private_directory_that_it_removes_at_shutdown():
    from actors.runs.host import LocalCluster

    cluster = LocalCluster(transport="zmq")
    try:
        assert cluster.transport.ipc_dir == str(cluster.ipc_dir)
        assert stat.S_IMODE(os.stat(cluster.ipc_dir).st_mode) == 0o700
    finally:
        cluster.shutdown()
    assert not os.path.exists(cluster.ipc_dir)


def test_a_restarted_receiver_binds_its_unix_socket_again_and_gets_what_its_predecessor_had_not_acknowledged(
        ipc_dir):
    async def test():
        first = ZmqTransport(ipc_dir=ipc_dir)
        async with first.open_sender(capacity=8) as sender:
            async with first.open_receiver(capacity=8, ack_when_done=True) as receiver:
                address = receiver.address
                sender.connect(address)
                for i in range(3):
                    await sender.send([b"%d" % i])
                with trio.fail_after(10):
                    assert await receiver.receive() == [b"0"]  # held, not done: nothing acknowledged
            assert sender.statistics()["in_flight"] == 3
            successor = ZmqTransport(ipc_dir=ipc_dir, rebind=[address])
            async with successor.open_receiver(capacity=8) as again:
                assert again.address == address
                with trio.fail_after(10):
                    assert [await again.receive() for _ in range(3)] == [[b"0"], [b"1"], [b"2"]]
                await assert_quiet(again)  # waiting for more, it acknowledges what it took
                with trio.fail_after(10):
                    await sender.drain()

    trio.run(test)


def test_a_rebind_never_takes_the_path_of_a_socket_that_still_listens_and_takes_a_leftover_one(ipc_dir, monkeypatch):
    """ZeroMQ binds a Unix socket over whatever file is at its path, a live socket's too (which then loses every
    new connection to it): a restarted endpoint waits for its predecessor to let go, as TCP's EADDRINUSE makes it."""
    monkeypatch.setattr(streams.zmq_socket, "REBIND_WAIT_S", 0.3)
    live = zmq.Context.instance().socket(zmq.ROUTER)
    live.setsockopt(zmq.LINGER, 0)
    address = f"ipc://{ipc_dir}/0123456789abcdef"
    live.bind(address)
    leftover = os.path.join(ipc_dir, "fedcba9876543210")  # a socket file of a process that died: nobody listens
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(leftover)

    async def test():
        with pytest.raises(OSError, match="still in use"):
            async with ZmqTransport(ipc_dir=ipc_dir, rebind=[address]).open_receiver():
                pass
        async with ZmqTransport(ipc_dir=ipc_dir).open_sender([address]) as sender:
            await sender.send([b"still mine"])
            with trio.fail_after(10):
                while not live.poll(10):
                    await trio.sleep(0.01)
            assert live.recv_multipart()[-1] == b"still mine"
        transport = ZmqTransport(ipc_dir=ipc_dir, rebind=[f"ipc://{leftover}"])
        async with transport.open_receiver() as receiver, transport.open_sender([receiver.address]) as sender:
            assert receiver.address == f"ipc://{leftover}"
            await sender.send([b"after"])
            with trio.fail_after(10):
                assert await receiver.receive() == [b"after"]

    try:
        trio.run(test)
    finally:
        live.close()


def test_replies_go_only_to_sockets_of_the_run_directory(ipc_dir):
    """New finding 13: any loopback port was a reply address, so a request could make the rollout, the league or the
    chunk server connect to any local service or another run's streams. On one host only this run's sockets are."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # a local service
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    service = f"tcp://127.0.0.1:{listener.getsockname()[1]}"
    other_run = private_dir(SOCKET_ROOT, "other")
    refused = [service, f"ipc://{other_run}/0123456789abcdef", f"ipc://{ipc_dir}/../x/0123456789abcdef",
               f"ipc://{ipc_dir}/control", f"ipc://{ipc_dir}/0123456789ABCDEF", f"ipc://{ipc_dir}", "ipc://@abstract"]

    async def test():
        transport = ZmqTransport(ipc_dir=ipc_dir)
        async with transport.open_receiver() as honest, \
                open_replies(transport, Kind.MATCH, "league") as replies:
            for address in refused:
                assert not replies.post(address, b"body")
            assert replies.post(honest.address, b"answer")
            with trio.fail_after(10):
                assert (await honest.receive())[-1] == b"answer"
            assert replies.statistics()["rejected"] == {"bad_address": len(refused)}
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing connected to the service

    try:
        trio.run(test)
    finally:
        listener.close()
        remove_private_dir(other_run)


async def cut_off(address: str, kind: Kind, timeout: float):
    """A raw DEALER that sends ``address`` a part twice as large as a frame of ``kind`` may be, once ZeroMQ has cut
    it off (its monitor saw the disconnection); the socket and its monitor."""
    peer = zmq.Context.instance().socket(zmq.DEALER)
    peer.setsockopt(zmq.LINGER, 0)
    monitor = peer.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    peer.connect(address)
    head, _ = FrameCounter("env-0").frame(kind, b"")
    peer.send_multipart([encode_link(LinkType.DATA, 0), head, b"x" * (2 * FRAME_LIMITS[kind])])
    with trio.fail_after(timeout):
        while not monitor.poll(0):
            await trio.sleep(0.01)  # a poll of the monitor socket: progress, not timing
    return peer, monitor


def closed(peer, monitor) -> None:
    peer.disable_monitor()
    monitor.close(0)
    peer.close()


def test_the_league_cuts_off_a_peer_that_sends_a_part_larger_than_a_match_request(ipc_dir):
    """Old finding 7: every receiver took parts of up to 256 MiB whatever its kind, each held before it was refused.
    The league's receivers take parts no larger than their kinds' frames: ZeroMQ cuts off a peer that sends one."""
    from actors.league.actor import LeagueActor, LeagueConfig

    async def test():
        transport = ZmqTransport(ipc_dir=ipc_dir)
        league = LeagueActor(LeagueConfig(members=[{"id": "main", "role": "main"}], state_dir=ipc_dir))
        async with transport.open_receiver() as matches, trio.open_nursery() as nursery:
            addresses = await nursery.start(league.run, transport, {})
            peer, monitor = await cut_off(addresses["requests"], Kind.MATCH_REQUEST, timeout=10)
            honest = FrameCounter("env-1").frame(Kind.MATCH_REQUEST, MatchRequest(5, matches.address, ["main"]).to_body())
            peer.send_multipart([encode_link(LinkType.DATA, 1), *honest])  # it reconnects: an honest one is answered
            with trio.fail_after(10):
                assert (await Inbox(matches, Kind.MATCH, lambda body: body).receive()) is not None
            requests = league.statistics()["streams"]["requests"]
            assert requests["received"] == 1 and requests["rejected"] == {}  # the large part never came in
            closed(peer, monitor)
            nursery.cancel_scope.cancel()

    trio.run(test)


def test_the_rollout_cuts_off_a_requester_that_sends_a_part_larger_than_a_frame_of_requests(tiny_model_dir, ipc_dir):
    """The rollout's requests take parts no larger than a frame of generation requests (about 1 MiB)."""
    from actors.rollout.actor import RolloutActor, RolloutConfig

    async def test():
        transport = ZmqTransport(ipc_dir=ipc_dir)
        rollout = RolloutActor(RolloutConfig(model_path=str(tiny_model_dir)))
        async with trio.open_nursery() as nursery:
            addresses = await nursery.start(rollout.run, transport, {})
            closed(*await cut_off(addresses["requests"], Kind.GENERATE, timeout=20))
            requests = rollout.statistics()["streams"]["requests"]
            assert requests["received"] == 0 and requests["rejected"] == {}  # the large part never came in
            nursery.cancel_scope.cancel()

    trio.run(test)
