"""rollout.backend=vllm: a real vLLM engine in a RolloutActor, over real ZeroMQ streams, started once for the module.

The learner's side is played by the test: it publishes weights as the learner does (``WeightsPublisher``) and
recomputes log-probs with the learner's own code (``collate``, ``policy_gradient_step``).
"""

import functools
import itertools

import pytest
import torch
import trio
from transformers import AutoModelForCausalLM, AutoTokenizer

pytest.importorskip("vllm", reason="the vllm extra is not installed (docs/backends.md)")

from streams.endpoints import Inbox, Outbox  # noqa: E402
from actors.runs.host import _LoopThread  # noqa: E402
from actors.rollout.actor import RolloutActor, RolloutConfig  # noqa: E402
from actors.learner.batch import single_turn_batch  # noqa: E402
from actors.learner.update import (Objective, ObjectiveState, action_logprobs, behaviour_gap,  # noqa: E402
                                   policy_gradient_step)
from streams.weights import WeightsPublisher, weights_to_bytes  # noqa: E402
from streams.channels import ZmqTransport  # noqa: E402
from streams.messages import WEIGHTS_TOPIC, Completion, GenerationRequest, decode_completions  # noqa: E402
from streams.wire import Kind  # noqa: E402

# Behaviour (vLLM) and learner log-probs of the same tokens under the same weights, mean absolute difference.
# Both run the model in float32 on the CPU: what is left is rounding (measured: about 1e-7 nats).
# The bar is 0.02; this asserts a fiftieth of it.
TOLERANCE = 4e-4
BOARD = "TicTacToe. You are {mark}.\n{board}\nMove:"


class Rig:
    """One vLLM rollout actor and the learner's ends of its streams, on a trio loop in a thread."""

    def __init__(self, model_dir, weights_dir, snapshot_dir):
        self.model_dir, self.weights_dir, self.snapshot_dir = str(model_dir), str(weights_dir), str(snapshot_dir)
        self.ids = itertools.count()
        self.loop = _LoopThread("vllm-rig")
        self.loop.start(self._serve)

    async def _serve(self, task_status=trio.TASK_STATUS_IGNORED):
        transport = ZmqTransport()
        async with (
            transport.open_publisher(capacity=16) as publisher,
            transport.open_receiver() as completions,
            trio.open_nursery() as nursery,
        ):
            self.weights = WeightsPublisher("learner", "main", Outbox(publisher, Kind.WEIGHTS, "learner",
                                            topic=WEIGHTS_TOPIC + b"main"), "tcp://127.0.0.1:9", self.weights_dir)
            self.rollout = RolloutActor(RolloutConfig(model_path=self.model_dir, backend="vllm", max_batch=64,
                                                      snapshot_dir=self.snapshot_dir))
            addresses = await nursery.start(self.rollout.run, transport, {"weights": [publisher.address]})
            self.reply_to, self.replies = completions.address, Inbox(completions, Kind.COMPLETION,
                                                                     decode_completions)
            async with transport.open_sender([addresses["requests"]]) as requests:
                self.requests = Outbox(requests, Kind.GENERATE, "env")
                task_status.started()
                await trio.sleep_forever()

    def run(self, async_fn, *args, **kwargs):
        return trio.from_thread.run(functools.partial(async_fn, *args, **kwargs), trio_token=self.loop.token)

    async def generate(self, prompts, *, temperature=1.0, max_tokens=8, min_version=0,
                       policies=None) -> list[Completion]:
        """``policies``: one per prompt (``main`` or a snapshot id), else ``main`` for all."""
        ids = [next(self.ids) for _ in prompts]
        for request_id, prompt, policy in zip(ids, prompts, policies or ["main"] * len(prompts)):
            await self.requests.send(GenerationRequest(request_id, self.reply_to, policy, prompt, temperature,
                                                       max_tokens, min_version).to_body())
        got = {}
        while len(got) < len(ids):  # what the actor has ready together comes in one frame
            got.update((completion.request_id, completion) for completion in await self.replies.receive())
        return [got[i] for i in ids]

    async def publish(self, version: int, model) -> None:
        """Publish ``model`` as ``version`` and wait until the rollout actor holds it (manifests are re-sent:
        pub/sub may drop one sent before the subscription is connected)."""
        await self.weights.publish(version, weights_to_bytes(model))
        while self.rollout.statistics()["version"] < version:  # progress poll
            await self.weights.announce_latest()
            await trio.sleep(0.05)

    def close(self):
        self.loop.stop(timeout=60)
        self.weights.close()


@pytest.fixture(scope="module")
def rig(tiny_model_dir, tmp_path_factory):
    rig = Rig(tiny_model_dir, tmp_path_factory.mktemp("weights"), tmp_path_factory.mktemp("snapshots"))
    yield rig
    rig.close()


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def boards(tokenizer, n: int) -> list[list[int]]:
    cells = [str(i) for i in range(1, 10)]
    texts = []
    for i in range(n):
        board = cells.copy()
        board[i % 9], board[(i * 4 + 1) % 9] = "X", "O" if (i * 4 + 1) % 9 != i % 9 else "X"
        rows = "\n".join("|".join(board[r:r + 3]) for r in (0, 3, 6))
        texts.append(BOARD.format(mark="XO"[i % 2], board=rows))
    return [tokenizer(t)["input_ids"] for t in texts]


def test_vllm_log_probs_agree_with_the_learners_before_and_after_an_update(rig, tokenizer, tiny_model_dir):
    learner = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    loads = rig.rollout.statistics()["vllm"]["weight_loads"]
    optimizer = torch.optim.Adam(learner.parameters(), lr=0.02)
    prompts = boards(tokenizer, 32)

    before = rig.run(rig.generate, prompts)
    assert all(set(c.versions) == {0} and len(c.logprobs) == len(c.token_ids) >= 1 for c in before)
    batch = single_turn_batch(prompts, before, [float(i % 3 - 1) for i in range(32)], tokenizer.pad_token_id)
    # the learner's per-batch metric, from its own update step (which also makes version 1)
    stats = policy_gradient_step(learner, optimizer, batch, Objective(minibatches=1), ObjectiveState(),
                                 temperature=1.0, version=0)
    assert stats["logprob_gap_same_version"] <= TOLERANCE
    moved = behaviour_gap(learner, batch, 1.0)  # the update changed the policy far more than the tolerance
    assert moved > 20 * TOLERANCE

    rig.run(rig.publish, 1, learner)
    after = rig.run(rig.generate, prompts, temperature=0.7)
    assert all(set(c.versions) == {1} for c in after)
    after_batch = single_turn_batch(prompts, after, pad_id=tokenizer.pad_token_id)
    gap_after = behaviour_gap(learner, after_batch, 0.7)
    print(f"logprob_gap before update={stats['logprob_gap_same_version']:.2e} after={gap_after:.2e} "
          f"(update moved log-probs by {moved:.3f})")
    assert gap_after <= TOLERANCE
    stats = rig.rollout.statistics()
    assert stats["vllm"]["weight_loads"] == loads + 1 and stats["backend"] == "vllm"


def test_requests_in_flight_resume_from_their_prefix_with_new_weights(rig, tokenizer, tiny_model_dir):
    """Long generations (a high temperature makes EOS rare) are interrupted by new weights: each token's
    log-prob is the one its tagged version gives it, so the prefix was carried over and re-read correctly."""
    old = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    new = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    with torch.no_grad():
        for p in new.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.05)
    prompts = boards(tokenizer, 48)
    resumed_before = rig.rollout.statistics()["vllm"]["resumed"]

    async def generate_and_swap(v_new: int) -> list[Completion]:
        out = {}
        async with trio.open_nursery() as nursery:
            async def generate():
                out["completions"] = await rig.generate(prompts, temperature=2.0, max_tokens=160)
            submitted = rig.rollout.statistics()["vllm"]["submissions"]
            nursery.start_soon(generate)
            while rig.rollout.statistics()["vllm"]["submissions"] < submitted + len(prompts):  # all in flight
                await trio.sleep(0.01)
            await rig.publish(v_new, new)
        return out["completions"]

    for _ in range(5):  # whether a request is still running when the weights land is up to the scheduler
        v_old = rig.rollout.statistics()["version"] + 1
        rig.run(rig.publish, v_old, old)
        completions = rig.run(generate_and_swap, v_old + 1)
        switched = [c for c in completions if set(c.versions) == {v_old, v_old + 1}]
        if switched:
            break
    assert switched, "no request was in flight when the weights changed, in five tries"
    assert rig.rollout.statistics()["vllm"]["resumed"] - resumed_before >= len(switched)
    for c in completions:
        assert c.versions == sorted(c.versions) and len(c.versions) == len(c.token_ids) == len(c.logprobs)
    batch = single_turn_batch(prompts, completions, pad_id=tokenizer.pad_token_id)
    with torch.no_grad():
        by_old, by_new = action_logprobs(old, batch, 2.0), action_logprobs(new, batch, 2.0)
    versions, mask = batch.versions[:, 1:], batch.action_mask[:, 1:]
    expected = torch.where(versions == v_old + 1, by_new, by_old)
    assert float((expected - batch.behaviour_logprobs[:, 1:]).abs()[mask].mean()) <= TOLERANCE
    wrong = torch.where(versions == v_old + 1, by_old, by_new)  # the other version's numbers would not fit
    wrong_gap = float((wrong - batch.behaviour_logprobs[:, 1:]).abs()[mask & (versions == v_old + 1)].mean())
    print(f"{len(switched)} of {len(completions)} requests resumed with new weights; the old weights' gap on "
          f"their new tokens: {wrong_gap:.3f}")
    assert wrong_gap > 20 * TOLERANCE


def test_weights_loaded_in_memory_and_from_a_file_are_the_same_weights(rig, tokenizer, tiny_model_dir):
    """The actor's loads go to the engine's worker in memory (one worker); the file path (several workers) loads
    the same bytes to the same parameters, and the engine then samples with the log-probs the learner computes."""
    sampler = rig.rollout.engine.sampler
    assert sampler.in_memory
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel() + 1)) * 0.05)
    version, before = rig.rollout.statistics()["version"] + 1, dict(sampler.stats)
    held_before = rig.run(sampler.weight_checksums)

    rig.run(rig.publish, version, model)  # the actor's own path
    assert sampler.stats["weight_loads_in_memory"] == before["weight_loads_in_memory"] + 1
    assert sampler.stats["weight_loads_from_file"] == before["weight_loads_from_file"]
    in_memory = rig.run(sampler.weight_checksums)
    assert in_memory != held_before

    rig.run(sampler.load, version, bytearray(weights_to_bytes(model)), in_memory=False)  # the same version again
    assert sampler.stats["weight_loads_from_file"] == before["weight_loads_from_file"] + 1
    assert rig.run(sampler.weight_checksums) == in_memory

    prompts = boards(tokenizer, 8)
    completions = rig.run(rig.generate, prompts, temperature=0.7)
    assert all(set(c.versions) == {version} for c in completions)
    gap = behaviour_gap(model, single_turn_batch(prompts, completions, pad_id=tokenizer.pad_token_id), 0.7)
    assert gap <= TOLERANCE


def test_a_request_waits_for_the_weights_of_its_min_version(rig, tokenizer, tiny_model_dir):
    version = rig.rollout.statistics()["version"]
    waits = rig.rollout.statistics()["version_waits"]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    out = {}

    async def ask_then_publish():
        async with trio.open_nursery() as nursery:
            async def generate():
                out["completions"] = await rig.generate(boards(tokenizer, 2), min_version=version + 1)
            nursery.start_soon(generate)
            while rig.rollout.statistics()["version_waits"] == waits:  # progress: the request is held
                await trio.sleep(0.01)
            out["held_at"] = rig.rollout.statistics()["version"]
            await rig.publish(version + 1, model)

    rig.run(ask_then_publish)
    assert out["held_at"] == version
    assert all(set(c.versions) == {version + 1} for c in out["completions"])


def test_a_request_the_engine_refuses_is_answered_with_the_reason_and_the_actor_serves_on(rig, tokenizer):
    refused_before = rig.rollout.statistics()["refused_requests"]
    bad, good = rig.run(rig.generate, boards(tokenizer, 1), temperature=5.0)[0], None
    good = rig.run(rig.generate, boards(tokenizer, 2))
    assert bad.error and "temperature" in bad.error and bad.token_ids == []
    assert all(not c.error and c.token_ids for c in good)
    assert rig.rollout.statistics()["refused_requests"] == refused_before + 1


def test_snapshots_are_sampled_beside_the_engine_with_their_own_weights(rig, tokenizer, tiny_model_dir):
    """A league's member on vLLM: requests for a snapshot of its policy are sampled (by the hf sampler, with
    the snapshot's weights) in the same actor, mixed with the live policy's; a snapshot that is not there is
    refused with the reason."""
    from actors.models.base_model import load_policy
    from actors.models.snapshots import write_snapshot

    model, _ = load_policy(tiny_model_dir)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))  # weights of its own
    write_snapshot(model, tokenizer, f"{rig.snapshot_dir}/main-v3")
    prompts = boards(tokenizer, 6)
    policies = ["main", "main-v3", "main", "main-v3", "main-v9", "main"]
    completions = rig.run(rig.generate, prompts, policies=policies)
    live = rig.rollout.statistics()["version"]
    for completion, policy, prompt in zip(completions, policies, prompts):
        if policy == "main-v9":
            assert "not a snapshot" in completion.error and not completion.token_ids
        else:
            assert not completion.error and completion.token_ids
            assert set(completion.versions) == ({3} if policy == "main-v3" else {live})
    snapshot = [(p, c) for p, c, policy in zip(prompts, completions, policies) if policy == "main-v3"]
    for prompt, completion in snapshot:  # the behaviour log-probs are the snapshot's, not the live policy's
        ids = torch.tensor([prompt + completion.token_ids])
        with torch.no_grad():
            logps = torch.log_softmax(model(ids).logits[0, len(prompt) - 1:-1].float(), -1)
        picked = logps.gather(-1, torch.tensor(completion.token_ids)[:, None])[:, 0]
        assert picked.tolist() == pytest.approx(completion.logprobs, abs=1e-4)


def test_stop_strings_end_a_vllm_completion_at_the_token_that_completes_them(tiny_model_dir, tokenizer):
    """An engine with stop strings (``sampling.stop``; its own engine, so the rig's keeps none): a completion that
    finishes ends at EOS or at the token that completes the first stop string (an odd cell's ``[1``... over two
    tokens, or ``]``), which it keeps; one that does not was cut at the budget and holds none. The log-probs stay
    the learner's."""
    from actors.rollout.sampling import StopStrings
    from actors.rollout.vllm_engine import VllmOptions, VllmSampler

    odd = ["[1", "[3", "[5", "[7", "[9"]
    stop = StopStrings.of(tokenizer, [*odd, "]"])
    sampler = VllmSampler(str(tiny_model_dir), tokenizer.eos_token_id, options=VllmOptions(kv_cache_gib=0.25),
                          name="stops", stop=stop)
    prompts = [list(tokenizer.apply_chat_template([{"role": "user", "content": tokenizer.decode(board)}],
                                                  add_generation_prompt=True, tokenize=True)["input_ids"])
               for board in boards(tokenizer, 32)]  # through its chat template, as the env prompts it
    try:
        async def sample_all(budget: int):
            samples = [None] * len(prompts)

            async def one(i):
                samples[i] = await sampler.sample(prompts[i], temperature=1.0, max_tokens=budget)

            async with trio.open_nursery() as nursery:
                for i in range(len(prompts)):
                    nursery.start_soon(one, i)
            return samples

        ends = {"stop": 0, "odd": 0, "eos": 0, "cut": 0}
        completions = []
        for budget in (2, 6):
            for s in trio.run(sample_all, budget):
                assert 1 <= len(s.tokens) == len(s.logprobs) == len(s.versions) <= budget
                text, before = (tokenizer.decode(t, skip_special_tokens=True) for t in (s.tokens, s.tokens[:-1]))
                assert not any(x in before for x in stop.strings), text  # nothing sampled after a stop string
                if not s.finished:
                    end = "cut"
                    assert len(s.tokens) == budget and not any(x in text for x in stop.strings)
                elif s.tokens[-1] == tokenizer.eos_token_id:
                    end = "eos"
                else:
                    end = "stop"
                    ends["odd"] += text.endswith(tuple(odd))
                    assert any(x in text for x in stop.strings), text
                ends[end] += 1
                # the token where the hf sampler's check (`StopStrings`) ends a completion
                assert stop.first_end(s.tokens) == (len(s.tokens) if end == "stop" else None)
                completions.append(Completion(len(completions), s.tokens, s.logprobs, s.versions, s.finished))
        print(f"vLLM with stop strings: {ends}")
        assert ends["odd"] and ends["stop"] > ends["odd"] and ends["cut"], ends  # each way to end was seen
        learner = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
        batch = single_turn_batch(prompts + prompts, completions, pad_id=tokenizer.pad_token_id)
        assert behaviour_gap(learner, batch, 1.0) <= TOLERANCE
    finally:
        sampler.close()


@pytest.mark.slow
def test_an_engine_of_two_workers_loads_weights_through_the_file_or_in_memory(tiny_model_dir):
    """tensor_parallel_size=2 (vLLM's "mp" executor; its CPU build can): weights go through a file by default,
    and in memory on request, to the same parameters in both workers."""
    from actors.rollout.vllm_engine import VllmOptions, VllmSampler

    sampler = VllmSampler(str(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir).eos_token_id,
                          options=VllmOptions(tensor_parallel_size=2, kv_cache_gib=0.25), name="tp2")
    try:
        assert not sampler.in_memory
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
        data = bytearray(weights_to_bytes(model))

        async def load_both_ways():
            held = await sampler.weight_checksums()
            await sampler.load(1, data)
            from_file = await sampler.weight_checksums()
            await sampler.load(1, data, in_memory=True)
            return held, from_file, await sampler.weight_checksums(), await sampler.sample([5, 6, 7], temperature=1.0,
                                                                                           max_tokens=4)

        held, from_file, in_memory, s = trio.run(load_both_ways)
        assert len(held) == 2 and held != from_file and from_file == in_memory
        assert sampler.stats["weight_loads_from_file"] == sampler.stats["weight_loads_in_memory"] == 1
        assert s.versions == [1] * len(s.tokens) and s.tokens
    finally:
        sampler.close()
