"""Generation backends side by side: tokens/s of rollout.backend=vllm and =hf, and vLLM's log-prob gap.

    python benchmarks/backends.py [--quick] [--requests 2048] [--rounds 3] [--max-tokens 8] [--model DIR]

One run, one process: a RolloutActor of each backend (the same model, one thread each) behind in-memory
streams. The same requests (TicTacToe prompts from random legal play, temperature 1, ``--max-tokens``, all sent
at once, at most 256 in flight) go to one actor and then the other, for ``--rounds`` rounds (the median
counts; the machine's load changes). vLLM's engine start is not timed (it is reported).

The log-prob gap: the learner's own recomputation (``actors.learner.update``) of the log-probs of vLLM's sampled
tokens, against the behaviour log-probs vLLM reported, mean absolute difference in nats; measured before and
after a weight update (one learner step, published as the learner publishes weights). The last line is
``vllm_tokens_per_s=<n> hf_tokens_per_s=<n> logprob_gap=<after the update>``.
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def prompts_of(tokenizer, n: int, seed: int = 0) -> list[list[int]]:
    from actors.models.base_model import demonstrations

    pairs = demonstrations("tictactoe", max(n // 4, 8), seed)
    prompts = [prompt for prompt, _ in pairs]
    return [tokenizer(p)["input_ids"] for p in random.Random(seed).choices(prompts, k=n)]


class Client:
    """Sends requests to one rollout actor and gathers its completions."""

    def __init__(self, requests, replies, reply_to: str):
        self.requests, self.replies, self.reply_to = requests, replies, reply_to
        self.ids = itertools.count()

    async def generate(self, prompts, max_tokens: int, min_version: int = 0):
        from streams.messages import GenerationRequest, encode_requests, split_requests

        ids = [next(self.ids) for _ in prompts]
        async with trio.open_nursery() as nursery:
            async def send_all():  # as an env actor sends them: many requests a frame
                for batch in split_requests([GenerationRequest(request_id, self.reply_to, "main", prompt, 1.0,
                                                               max_tokens, min_version)
                                             for request_id, prompt in zip(ids, prompts)]):
                    await self.requests.send(encode_requests(batch))
            nursery.start_soon(send_all)
            got = {}
            while len(got) < len(ids):
                got.update((completion.request_id, completion) for completion in await self.replies.receive())
        return [got[i] for i in ids]


async def measure(args, model_dir: str, prompts: list[list[int]], weights_dir: str) -> dict:
    from transformers import AutoModelForCausalLM

    from streams.endpoints import Inbox, Outbox
    from actors.rollout.actor import RolloutActor, RolloutConfig
    from actors.learner.batch import single_turn_batch
    from actors.learner.update import Objective, ObjectiveState, behaviour_gap, policy_gradient_step
    from streams.weights import WeightsPublisher, weights_to_bytes
    from streams.channels import MemoryTransport
    from streams.messages import WEIGHTS_TOPIC, decode_completions
    from streams.wire import Kind

    learner = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    transport, result = MemoryTransport(), {"vllm": [], "hf": []}
    async with transport.open_publisher() as publisher, trio.open_nursery() as nursery:
        weights = WeightsPublisher("learner", "main", Outbox(publisher, Kind.WEIGHTS, "learner",
                                   topic=WEIGHTS_TOPIC + b"main"), "mem://unused", weights_dir)
        actors, clients = {}, {}
        for backend in ("vllm", "hf"):
            started = time.perf_counter()
            actors[backend] = RolloutActor(RolloutConfig(model_path=model_dir, backend=backend), name=backend)
            addresses = await nursery.start(actors[backend].run, transport, {"weights": [publisher.address]})
            replies = await nursery.start(_open_receiver, transport)
            requests = await nursery.start(_open_sender, transport, addresses["requests"])
            clients[backend] = Client(Outbox(requests, Kind.GENERATE, "bench"),
                                      Inbox(replies, Kind.COMPLETION, decode_completions), replies.address)
            result[f"{backend}_start_s"] = time.perf_counter() - started
        await clients["vllm"].generate(prompts[:64], args.max_tokens)  # warm-up, untimed
        for _ in range(args.rounds):
            for backend in ("vllm", "hf"):
                started = time.perf_counter()
                completions = await clients[backend].generate(prompts, args.max_tokens)
                tokens = sum(len(c.token_ids) for c in completions)
                result[backend].append(tokens / (time.perf_counter() - started))
                if backend == "vllm":
                    sampled = completions
        check = prompts[:256]
        result["gap_before"] = behaviour_gap(learner, single_turn_batch(check, sampled[:256]), 1.0)
        rng = random.Random(1)  # one learner step on vLLM's completions, with random returns: version 1
        batch = single_turn_batch(check, sampled[:256], [float(rng.choice([-1, 1])) for _ in check])
        policy_gradient_step(learner, torch.optim.Adam(learner.parameters(), lr=5e-3), batch, Objective(),
                             ObjectiveState(), temperature=1.0)
        result["update_moved"] = behaviour_gap(learner, batch, 1.0)
        await weights.publish(1, weights_to_bytes(learner))
        after = await clients["vllm"].generate(check, args.max_tokens, min_version=1)
        assert all(set(c.versions) == {1} for c in after)
        result["gap_after"] = behaviour_gap(learner, single_turn_batch(check, after), 1.0)
        weights.close()
        nursery.cancel_scope.cancel()
    return result


async def _open_receiver(transport, task_status=trio.TASK_STATUS_IGNORED):
    async with transport.open_receiver(capacity=1024) as receiver:
        task_status.started(receiver)
        await trio.sleep_forever()


async def _open_sender(transport, address: str, task_status=trio.TASK_STATUS_IGNORED):
    async with transport.open_sender([address], capacity=1024) as sender:
        task_status.started(sender)
        await trio.sleep_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="about a minute: 512 requests, 2 rounds, a quick model")
    parser.add_argument("--requests", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--model", default=None, help="a Hugging Face model directory (default: tidal's tiny model)")
    parser.add_argument("overrides", nargs="*", help="model.cache_dir=... (where the tiny model is made)")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.rounds = 512, 2
    from actors.models.base_model import TinyModelConfig, ensure_base_model

    cache = next((o.split("=", 1)[1] for o in args.overrides if o.startswith("model.cache_dir=")),
                 "~/.cache/tidal/models")
    # --quick: a briefly warmed-up model (seconds to make); the speed and the gap do not depend on its skill
    tiny = TinyModelConfig(warmup_games=200, warmup_steps=30, warmup_batch=32) if args.quick else TinyModelConfig()
    model_dir = args.model or str(ensure_base_model(cache, tiny))
    from transformers import AutoTokenizer

    prompts = prompts_of(AutoTokenizer.from_pretrained(model_dir), args.requests)
    with tempfile.TemporaryDirectory(dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as weights_dir:
        r = trio.run(measure, args, model_dir, prompts, weights_dir)
    vllm, hf = statistics.median(r["vllm"]), statistics.median(r["hf"])
    print(f"model {model_dir}; {args.requests} requests, temperature 1, max {args.max_tokens} tokens, "
          f"{args.rounds} rounds")
    print(f"vllm: {', '.join(f'{x:.0f}' for x in r['vllm'])} tokens/s (engine start {r['vllm_start_s']:.1f} s)")
    print(f"hf:   {', '.join(f'{x:.0f}' for x in r['hf'])} tokens/s (start {r['hf_start_s']:.1f} s)")
    print(f"log-prob gap (vLLM's behaviour log-probs vs the learner's): before an update {r['gap_before']:.2e}, "
          f"after {r['gap_after']:.2e} nats (the update moved log-probs by {r['update_moved']:.3f})")
    print(f"vllm_tokens_per_s={vllm:.0f} hf_tokens_per_s={hf:.0f} logprob_gap={r['gap_after']:.2e}")


if __name__ == "__main__":  # vLLM spawns processes: this module is imported again in them
    main()
