"""Learner lives: a learner restarted from an older checkpoint announces lower versions in a newer life, and the
rollout and env actors follow it down. Crafted announcements, over real ZeroMQ sockets across a learner's restart
at its old address (the rollout's side), and through the env actor's admission."""

import pytest
import torch
import trio
import trio.testing

from actors.env.admission import Admission
from actors.rollout.weights import HeldWeights
from streams.channels import MemoryTransport, ZmqTransport
from streams.endpoints import Inbox, Outbox
from streams.messages import VERSION_TOPIC, WEIGHTS_TOPIC, VersionAnnounced, WeightsManifest
from streams.weights import CHUNK_BYTES, FetchedWeights, LearnerFeed, chunk_crcs, load_weights, weights_to_bytes
from streams.wire import FrameError, Kind
from tests.factories import admit_all


def test_a_version_announcement_carries_the_learners_life():
    assert VersionAnnounced.from_body(VersionAnnounced("main", 9, 2).to_body()) == VersionAnnounced("main", 9, 2)
    with pytest.raises(FrameError, match="negative life"):
        VersionAnnounced.from_body(VersionAnnounced("main", 9, -1).to_body())


def weights_of(value: float) -> bytes:
    layer = torch.nn.Linear(2, 2, bias=False)
    torch.nn.init.constant_(layer.weight, value)
    return weights_to_bytes(layer)


class Files:
    """The follower's stand-in: each manifest's bytes by its path (as a shared-memory file would hold them)."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.fetched: list[str] = []  # the paths fetched, in order

    def manifest(self, life: int, version: int) -> WeightsManifest:
        data = self.files[f"life{life}-v{version}"] = weights_of(life * 100 + version)
        return WeightsManifest("main", version, len(data), CHUNK_BYTES, chunk_crcs(data, CHUNK_BYTES), "host",
                               f"life{life}-v{version}", "tcp://127.0.0.1:1", life)

    async def fetch(self, manifest: WeightsManifest) -> bytearray:
        self.fetched.append(manifest.path)
        return bytearray(self.files[manifest.path])


async def announce(publisher, life: int, versions: list[int], files: Files, manifests: bool = True) -> None:
    """A learner's publisher: each version, then its manifest, again and again (the learner re-announces every
    second; a subscription takes a moment to reach the publisher)."""
    versions_out = Outbox(publisher, Kind.VERSION, "learner", topic=VERSION_TOPIC + b"main")
    weights_out = Outbox(publisher, Kind.WEIGHTS, "learner", topic=WEIGHTS_TOPIC + b"main")
    while True:
        for version in versions:
            await versions_out.send(VersionAnnounced("main", version, life).to_body())
            if manifests:
                await weights_out.send(files.manifest(life, version).to_body())
        await trio.sleep(0.02)


def loading_into(model):
    """The hf engine's stand-in: its ``load(version, tensors)``, into ``model``'s parameters in a worker thread."""
    async def load(version: int, tensors) -> None:
        await trio.to_thread.run_sync(load_weights, model, tensors)

    return load


async def waits_beyond(weights: HeldWeights, waits: int) -> None:
    """Until ``weights`` has counted more than ``waits`` waits for weights (progress poll: a waiter in a thread)."""
    while weights.statistics()["version_waits"] <= waits:
        await trio.sleep(0.01)


def held(model) -> float:
    return float(model.weight.detach()[0, 0])


def test_a_rollout_follows_a_restarted_learner_down_to_its_older_checkpoint_and_samples_no_dead_weights():
    """Life 0 reaches version 12 and dies; life 1 starts again at the same address from the checkpoint at 10.
    The rollout holds version 12 of life 0 until life 1 announces itself; from then on a batch under way
    (``swap``, between two decoding steps) and the next batch (``wait_for``) wait for life 1's weights,
    and it takes version 10 (lower) of life 1. A late word of life 0 changes nothing."""
    files, model = Files(), torch.nn.Linear(2, 2, bias=False)
    weights, load = HeldWeights("main", "rollout-t"), loading_into(model)
    swapped = []

    async def swap_mid_batch():
        swapped.append(await trio.to_thread.run_sync(weights.swap, load))

    async def main():
        transport = ZmqTransport()
        async with (
            transport.open_subscriber([], [VERSION_TOPIC + b"main", WEIGHTS_TOPIC + b"main"]) as subscriber,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(weights.follow, LearnerFeed(subscriber), files)
            with trio.fail_after(30):
                async with transport.open_publisher(capacity=16) as dead:
                    subscriber.connect(address := dead.address)
                    async with trio.open_nursery() as life0:
                        life0.start_soon(announce, dead, 0, [11, 12], files)
                        while "life0-v12" not in files.fetched:  # progress: 12 arrived (loaded alone, not after 11)
                            await trio.sleep(0.01)
                        await weights.wait_for(12, load)
                        life0.cancel_scope.cancel()
                assert (weights.version, weights.life, held(model)) == (12, 0, 12.0)  # the learner dies here
                await weights.wait_for(12, load)  # its weights are still the live ones: nothing to wait for
                async with transport.open_publisher(capacity=16, address=address) as live:
                    async with trio.open_nursery() as life1:  # life 1 says its version first
                        life1.start_soon(announce, live, 1, [10], files, False)
                        while weights.learner_life != 1:
                            await trio.sleep(0.01)
                        life1.cancel_scope.cancel()
                    assert not weights.live and weights.statistics()["lives_followed"] == 1
                    waits = weights.statistics()["version_waits"]
                    nursery.start_soon(swap_mid_batch)  # a batch under way: its next step waits for life 1
                    await waits_beyond(weights, waits)
                    assert swapped == [] and held(model) == 12.0
                    nursery.start_soon(announce, live, 1, [10], files)  # now the manifest of version 10
                    while not swapped:
                        await trio.sleep(0.01)
                    assert swapped == [10] and (weights.version, weights.life, held(model)) == (10, 1, 110.0)
                    weights.on_life_announced(0)  # a late word of the dead life
                    await weights.wait_for(10, load)
                    assert (weights.version, weights.life, weights.learner_life) == (10, 1, 1)
                    nursery.cancel_scope.cancel()

    trio.run(main)
    stats = weights.statistics()
    assert stats["weights_applied"] == 2 and stats["weights_applied_mid_batch"] == 1
    assert (stats["life"], stats["learner_life"]) == (1, 1)


def test_a_manifest_names_its_life_so_a_missed_announcement_loses_nothing():
    """A follower that subscribed between an announcement and its manifest hears the manifest first: it is taken
    as the life it names (taken as no life, as before manifests named one, a restart to a lower version could never
    replace it). A newer life's manifest heard before its announcement announces that life: the restart to a
    lower version is followed, and a late manifest of the dead life is not taken."""
    files, model = Files(), torch.nn.Linear(2, 2, bias=False)
    weights, load = HeldWeights("main", "rollout-t"), loading_into(model)

    async def main():
        send, heard = trio.open_memory_channel(8)  # the learner's feed as a late subscriber hears it
        async with trio.open_nursery() as nursery:
            nursery.start_soon(weights.follow, heard, files)
            await send.send(files.manifest(0, 12))
            await weights.wait_for(12, load)
            assert (weights.version, weights.life, weights.learner_life, held(model)) == (12, 0, 0, 12.0)
            await send.send(files.manifest(1, 10))  # life 1, from the checkpoint at 10: no announcement heard
            await send.send(files.manifest(0, 13))  # a late word of life 0
            await trio.testing.wait_all_tasks_blocked()
            await weights.wait_for(0, load)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert (weights.version, weights.life, weights.learner_life, held(model)) == (10, 1, 1, 110.0)
    assert weights.statistics()["weights_applied"] == 2 and weights.statistics()["lives_followed"] == 1


def test_the_next_batch_waits_for_the_new_lifes_weights():
    """``wait_for`` with the engine's ``load`` (a batch about to be sampled) with a dead life's weights held waits
    for the live life's, even when the batch asks for no newer version, and never loads weights of a life that is
    not the live one."""
    files, model = Files(), torch.nn.Linear(2, 2, bias=False)
    weights, load = HeldWeights("main", "rollout-t"), loading_into(model)

    async def main():
        weights.on_life_announced(0)
        weights.offer(fetched(files, 0, 12))
        await weights.wait_for(12, load)
        assert (weights.version, weights.life) == (12, 0)
        weights.on_life_announced(1)
        caught_up = []
        async with trio.open_nursery() as nursery:
            async def batch():
                await weights.wait_for(0, load)
                caught_up.append(weights.version)

            nursery.start_soon(batch)
            await trio.testing.wait_all_tasks_blocked()
            assert caught_up == [] and weights.statistics()["version_waits"] == 1
            weights.offer(fetched(files, 0, 13))  # the dead life's, arriving late: never loaded
            await trio.testing.wait_all_tasks_blocked()
            assert caught_up == [] and held(model) == 12.0 and weights.statistics()["version_waits"] == 2
            weights.offer(fetched(files, 1, 10))
        assert caught_up == [10] and (weights.life, held(model)) == (1, 110.0)

    trio.run(main)


def test_vllm_requests_wait_until_the_new_lifes_weights_are_loaded_into_the_engine():
    class Engine:  # vLLM's stand-in: what was loaded, in order
        loads = []

        async def load(self, version, data):
            self.loads.append((version, float(torch.frombuffer(bytearray(data[-4:]), dtype=torch.float32)[0])))

    files, engine = Files(), Engine()
    weights = HeldWeights("main", "rollout-v")
    answered = []

    async def request(min_version: int):
        await weights.wait_for(min_version)
        answered.append((weights.version, weights.life))

    async def main():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(weights.load_arrivals, engine.load)
            weights.on_life_announced(0)
            weights.offer(fetched(files, 0, 12))
            await request(12)
            weights.on_life_announced(1)  # life 1, from the checkpoint at 10: a new request waits for its weights
            nursery.start_soon(request, 0)
            await trio.testing.wait_all_tasks_blocked()
            assert answered == [(12, 0)] and weights.statistics()["version_waits"] == 2  # (the first waited too)
            weights.offer(fetched(files, 1, 10))
            await trio.testing.wait_all_tasks_blocked()
            assert answered == [(12, 0), (10, 1)]
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert engine.loads == [(12, 12.0), (10, 110.0)]


def fetched(files: Files, life: int, version: int) -> FetchedWeights:
    files.manifest(life, version)
    return FetchedWeights(version, bytearray(files.files[f"life{life}-v{version}"]), life)


def test_env_admission_follows_a_new_life_down_and_ignores_the_dead_one():
    """The env actor's admission counts against the live learner: life 1, restarted from the checkpoint at 10,
    shrinks the limit below what life 0 (at 12) had admitted; nothing more starts until life 1 has retrained past
    12, and a late word of life 0 changes nothing. Through the env actor's subscription (``follow_versions``)."""
    admission = Admission("main", max_staleness=1, batch_episodes=4)

    async def main():
        transport = MemoryTransport()
        async with (
            transport.open_publisher(capacity=16) as publisher,
            transport.open_subscriber([publisher.address], [VERSION_TOPIC + b"main"], capacity=16) as subscriber,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(admission.follow_versions, Inbox(subscriber, Kind.VERSION, VersionAnnounced.from_body,
                                                                topic=True))
            out = Outbox(publisher, Kind.VERSION, "learner", topic=VERSION_TOPIC + b"main")
            expected = [((0, 12), 12, (1 + 12 + 1) * 4), ((1, 10), 10, 0), ((0, 13), 10, 0), ((1, 12), 12, 0),
                        ((1, 13), 13, 4)]  # (life, version) announced -> the version counted, how many more start
            for (life, version), counted, more in expected:
                await out.send(VersionAnnounced("main", version, life).to_body())
                await trio.testing.wait_all_tasks_blocked()
                assert (admission.version("main"), admit_all(admission)) == (counted, more), (life, version)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert admission.statistics()["learner_lives"] == {"main": 1}
    assert admission.statistics()["started"] == (1 + 13 + 1) * 4
