"""Weights over real ZeroMQ sockets: versions in shared memory or in checked chunks, and late joiners."""

import os
from pathlib import Path

import trio

from streams.endpoints import Inbox, Outbox
from streams.weights import WeightsFollower, WeightsPublisher
from streams.channels import ZmqTransport
from streams.messages import WEIGHTS_TOPIC, WeightsFetch, WeightsManifest
from streams.wire import Kind

TOPIC = WEIGHTS_TOPIC + b"main"


def payload(version: int) -> bytes:
    return bytes([version]) * 2500 + os.urandom(1500)


async def latest_manifest(weights: WeightsPublisher, inbox: Inbox) -> WeightsManifest:
    """What a late joiner hears: the learner re-announces its latest version until one arrives."""
    for _ in range(200):
        await weights.announce_latest()
        with trio.move_on_after(0.05):
            return await inbox.receive()
    raise AssertionError("no manifest arrived")


def test_a_late_joiner_gets_the_latest_version_checked(tmp_path):
    async def test():
        transport = ZmqTransport()
        async with (
            transport.open_publisher(capacity=16) as publisher,
            transport.open_receiver() as fetches,
            trio.open_nursery() as nursery,
        ):
            outbox = Outbox(publisher, Kind.WEIGHTS, "learner", topic=TOPIC)
            weights = WeightsPublisher("learner", "main", outbox, fetches.address, directory=str(tmp_path),
                                       chunk_bytes=1000)
            nursery.start_soon(weights.serve_chunks, Inbox(fetches, Kind.WEIGHTS_FETCH, WeightsFetch.from_body),
                               transport)
            sent = {v: payload(v) for v in range(3)}
            for version, data in sent.items():  # nobody listens yet
                await weights.publish(version, data)
            assert len(list(weights.directory.iterdir())) == 2  # the last two versions are kept

            async with transport.open_subscriber([publisher.address], [TOPIC]) as subscription:
                manifest = await latest_manifest(weights, Inbox(subscription, Kind.WEIGHTS,
                                                                WeightsManifest.from_body, topic=True))
            assert (manifest.version, manifest.chunks) == (2, 4)

            local = WeightsFollower(transport)  # same host: reads the shared-memory file
            assert bytes(await local.fetch(manifest)) == sent[2]
            assert local.stats["from_shared_memory"] == 1

            remote = WeightsFollower(transport)
            remote.host = "another-host"  # as if on another machine: the chunks come over ZeroMQ
            assert bytes(await remote.fetch(manifest)) == sent[2]
            assert remote.stats["from_chunks"] == 1 and weights.stats["chunks_served"] == 4

            gone = WeightsManifest(**{**manifest.__dict__, "version": 0})  # no longer kept by the learner
            assert await remote.fetch(gone) is None and remote.stats["fetch_failed"] == 1

            with open(manifest.path, "r+b") as f:  # a flipped byte in shared memory
                f.seek(1200)
                f.write(b"\xff")
            assert await local.fetch(manifest) is None and local.stats["corrupt"] == 1
            weights.close()
            assert list(tmp_path.iterdir()) == []
            nursery.cancel_scope.cancel()

    trio.run(test)


class Sent:
    """An outbox that keeps what is sent."""

    def __init__(self):
        self.bodies = []

    async def send(self, body):
        self.bodies.append(body)


def test_small_shared_memory_drops_the_oldest_version_first_then_moves_to_the_fallback(tmp_path, monkeypatch):
    """Docker's 64 MB /dev/shm: keeping two versions means writing a third before the oldest goes, which failed
    (ENOSPC, a crash loop) for a model over about 20 MB. Where a version does not fit, the oldest kept one goes
    first; where even one does not fit, the versions go to the fallback directory, on disk."""
    from streams import weights as weights_module

    shm, disk = tmp_path / "shm", tmp_path / "disk"
    shm.mkdir()
    disk.mkdir()
    room = {str(shm): 2.5 * 4000}  # room for two versions of 4000 bytes, not three

    def free(directory):
        used = sum(f.stat().st_size for f in Path(directory).iterdir())
        return int(room.get(str(Path(directory).parent), 10**9) - used)

    monkeypatch.setattr(weights_module, "free_bytes", free)
    publisher = WeightsPublisher("learner", "main", Sent(), "tcp://127.0.0.1:1", directory=str(shm),
                                 fallback=str(disk), chunk_bytes=1000)

    async def publish(versions):
        for version in versions:
            await publisher.publish(version, payload(version))

    trio.run(publish, range(3))
    kept = sorted(f.name for f in publisher.directory.iterdir())
    assert kept == ["learner-main-v1.safetensors", "learner-main-v2.safetensors"]
    assert publisher.stats["removed_early"] == 1 and publisher.directory.parent == shm

    room[str(shm)] = 3000  # less than one version: the disk from now on
    trio.run(publish, [3])
    assert publisher.directory.parent == disk and publisher.stats["published"] == 4
    assert Path(publisher.latest.path).read_bytes()[:2500] == bytes([3]) * 2500
    publisher.close()
    assert not any(shm.iterdir()) and not any(disk.iterdir())


def test_without_shared_memory_the_fallback_directory_is_used(tmp_path):
    publisher = WeightsPublisher("learner", "main", Sent(), "tcp://127.0.0.1:1", directory=None,
                                 fallback=str(tmp_path))
    assert publisher.directory.parent == tmp_path
    publisher.close()
