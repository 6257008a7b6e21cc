"""The rollout actor on its own, over in-memory streams: it never samples with weights older than asked."""

import torch
import trio
import trio.testing
from transformers import AutoModelForCausalLM, AutoTokenizer

from streams.endpoints import Inbox, Outbox
from actors.rollout.actor import RolloutActor, RolloutConfig
from streams.weights import WeightsPublisher, weights_to_bytes
from streams.channels import MemoryTransport
from streams.messages import WEIGHTS_TOPIC, Completion, GenerationRequest
from streams.wire import Kind


def test_a_request_waits_for_the_weights_of_its_min_version(tiny_model_dir, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    newer = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        newer.lm_head.weight.mul_(0.5)
    tensors = weights_to_bytes(newer)
    prompt = tokenizer("TicTacToe. You are X.\n1|2|3\n4|5|6\n7|8|9\nMove:")["input_ids"]
    seen = {}

    async def main():
        transport = MemoryTransport()
        rollout = RolloutActor(RolloutConfig(model_path=str(tiny_model_dir)))
        async with transport.open_publisher() as publisher, transport.open_receiver() as completions, \
                trio.open_nursery() as nursery:
            addresses = await nursery.start(rollout.run, transport, {"weights": [publisher.address]})
            weights = WeightsPublisher("learner", "main", Outbox(publisher, Kind.WEIGHTS, "learner",
                                       topic=WEIGHTS_TOPIC + b"main"), fetch_from="mem://unused", directory=str(tmp_path))
            replies = Inbox(completions, Kind.COMPLETION, Completion.from_body)
            async with transport.open_sender([addresses["requests"]]) as requests:
                out = Outbox(requests, Kind.GENERATE, "env")
                await out.send(GenerationRequest(1, completions.address, "main", prompt, 1.0, 4, 0).to_body())
                seen["v0"] = await replies.receive()
                await out.send(GenerationRequest(2, completions.address, "main", prompt, 1.0, 4, 1).to_body())
                while rollout.statistics()["version_waits"] == 0:  # progress poll: the request is held
                    await trio.sleep(0.01)
                seen["held_at"] = rollout.statistics()["version"]
                await weights.publish(1, tensors)
                seen["v1"] = await replies.receive()
            seen["stats"] = rollout.statistics()
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert set(seen["v0"].versions) == {0} and seen["held_at"] == 0
    assert seen["v1"].request_id == 2 and set(seen["v1"].versions) == {1}
    assert seen["stats"]["version"] == 1 and seen["stats"]["weights_applied"] == 1


def test_snapshots_are_served_beside_the_live_policy_and_a_bad_one_is_refused(tiny_model_dir, tmp_path):
    """A league's rollout actor: a request for ``main-v7`` is sampled with that snapshot (its tokens carry
    version 7) by the same actor that serves ``main``; a missing or tampered snapshot is refused, with why."""
    from actors.models.base_model import load_policy
    from actors.models.snapshots import write_snapshot

    model, tokenizer = load_policy(tiny_model_dir)
    write_snapshot(model, tokenizer, tmp_path / "main-v7")
    tampered = write_snapshot(model, tokenizer, tmp_path / "main-v8")
    (tampered / "config.json").chmod(0o644)
    (tampered / "config.json").write_text((tampered / "config.json").read_text() + " ")
    prompt = tokenizer("Kuhn Poker. Your card: K.\nMove:")["input_ids"]
    seen = {}

    async def main():
        transport = MemoryTransport()
        rollout = RolloutActor(RolloutConfig(model_path=str(tiny_model_dir), snapshot_dir=str(tmp_path)))
        async with transport.open_receiver() as completions, trio.open_nursery() as nursery:
            addresses = await nursery.start(rollout.run, transport, {"weights": []})
            replies = Inbox(completions, Kind.COMPLETION, Completion.from_body)
            async with transport.open_sender([addresses["requests"]]) as requests:
                out = Outbox(requests, Kind.GENERATE, "env")
                for i, policy in enumerate(["main", "main-v7", "main-v8", "main-v9", "other-v7"]):
                    await out.send(GenerationRequest(i, completions.address, policy, prompt, 1.0, 4, 0).to_body())
                    reply = await replies.receive()
                    seen[policy] = reply
            seen["stats"] = rollout.statistics()
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert not seen["main"].error and set(seen["main"].versions) == {0}
    assert not seen["main-v7"].error and seen["main-v7"].token_ids and set(seen["main-v7"].versions) == {7}
    assert "does not match its checksum" in seen["main-v8"].error and not seen["main-v8"].token_ids
    assert "not a snapshot" in seen["main-v9"].error
    assert "not 'other-v7'" in seen["other-v7"].error
    assert seen["stats"]["snapshots_loaded"] == 1 and seen["stats"]["unknown_policy"] == 3


def test_latency_s_bounds_what_one_actor_answers(tiny_model_dir):
    """``latency_s`` (the latency-bound task): every batch takes that long on top of sampling, so one actor
    with ``max_batch=1`` answers 3 requests no sooner than 3 latencies after they came (trio's virtual clock)."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompt = tokenizer("TicTacToe. You are X.\n1|2|3\n4|5|6\n7|8|9\nMove:")["input_ids"]
    answered = []

    async def main():
        transport = MemoryTransport()
        rollout = RolloutActor(RolloutConfig(model_path=str(tiny_model_dir), max_batch=1, latency_s=10.0))
        async with transport.open_receiver() as completions, trio.open_nursery() as nursery:
            addresses = await nursery.start(rollout.run, transport, {})
            replies = Inbox(completions, Kind.COMPLETION, Completion.from_body)
            async with transport.open_sender([addresses["requests"]]) as requests:
                sent_at = trio.current_time()
                for request_id in range(3):
                    out = Outbox(requests, Kind.GENERATE, "env")
                    await out.send(GenerationRequest(request_id, completions.address, "main", prompt, 1.0, 4,
                                                     0).to_body())
                for _ in range(3):
                    await replies.receive()
                    answered.append(trio.current_time() - sent_at)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert [round(t // 10) for t in answered] == [1, 2, 3], answered
