"""Environment hosting: can one env actor keep 1,000 episodes stepping faster than GEM's own vector env?

    python benchmarks/env_hosting.py [--quick] [--episodes 1000] [--steps 60000] [--rounds 3] [--transport memory|zmq]
    python benchmarks/env_hosting.py --profile FILE [--steps 8000]   # where a generation-path move's time goes
    python benchmarks/env_hosting.py --floor [--quick]   # GEM against the generation path's own work in one loop
    python benchmarks/env_hosting.py --lanes [--steps 30000]   # the lane group alone against a plain loop's work

Side by side, in one run, on the same GEM game (``game:GuessTheNumber-v0-easy``) and the same number of
environment steps, with a scripted policy (a random guess; no model):

- GEM: ``AsyncVectorEnv`` (GEM's thread-pool vector env) of ``--episodes`` environments, stepped with a
  batch of actions at a time.
- tidal: one ``EnvActor`` hosting ``--episodes`` concurrent episodes of the same game through the GEM
  adapter, stepped in its lane group (``actors.env.lanes``), the same scripted policy (GEM's own random action)
  in the seat.
- tidal's generation path: the same episodes with every move asked of a scripted rollout actor over tidal's
  streams (tokenized prompt, generation requests many to a frame, completions, an Arrow episode to a sink), as
  in a training run.
- the floor: the generation path's own work in one plain loop (``floor_steps_per_s``: no trio, actors or
  sockets), what any structure around it in Python would still pay.

The four take turns for ``--rounds`` rounds and the medians count (the machine's load changes; GEM's thousand
threads suffer most from it). What the process loaded (torch, transformers, GEM) is frozen out of the garbage
collector's reach before anything is timed, as an env actor does when it starts, so that GEM and tidal run alike.
Then the steps/s of each tidal game and task on its own (random legal play, no actor).
The last line is ``vs_gem=<x> generation_path_vs_gem=<x> generation_path_vs_floor=<x> tidal_steps_per_s=<n>``:
tidal's steps/s over GEM's, the generation path's over GEM's and over the floor's, tidal's steps/s.
``--profile FILE``: only the generation path, under cProfile from its warm-up on: the share of a move's time
each part of the path takes (``PARTS``), then its top functions by own and by cumulative time, printed and
written to FILE.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import random
import statistics
import sys
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GEM_GAME = "game:GuessTheNumber-v0-easy"  # numbers 1-10, 4 turns


def guess(rng: random.Random) -> str:
    return "\\boxed{%d}" % rng.randint(1, 10)


def gem_steps_per_s(episodes: int, steps: int) -> float:
    import gem

    with contextlib.redirect_stdout(None):
        vector = gem.make_vec([GEM_GAME] * episodes, async_mode=True)
    vector.reset(seed=0)
    rng, done = random.Random(0), 0
    for _ in range(max(2, steps // episodes // 10)):  # warm-up, untimed: the pool's threads start
        vector.step([guess(rng) for _ in range(episodes)])
    start = time.perf_counter()
    while done < steps:
        vector.step([guess(rng) for _ in range(episodes)])  # finished ones reset themselves (same step)
        done += episodes
    return done / (time.perf_counter() - start)


def _random_answers(tokenizer):
    """A rule for the scripted rollout: one of 50 boxed guesses (token ids, ending with EOS), at random."""
    from streams.messages import Completion

    rng = random.Random(0)
    answers = [tokenizer(guess(rng))["input_ids"] + [tokenizer.eos_token_id] for _ in range(50)]
    rng = random.Random(1)

    def reply(request):
        tokens = rng.choice(answers)
        return Completion(request.request_id, tokens, [0.0] * len(tokens), [0] * len(tokens), True)

    return reply


async def _drain(receiver):
    while True:
        await receiver.receive()


class _TaskClock(trio.abc.Instrument):
    """Wall time each trio task runs (``task.name`` -> seconds), counted while ``on``: where the path's time goes
    with no profiler's cost on every call (a task runs hundreds of moves a step, so the clock's own cost is nil)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.on, self._started = False, 0.0

    def before_task_step(self, task) -> None:
        self._started = time.perf_counter()

    def after_task_step(self, task) -> None:
        if self.on:
            self.seconds[task.name] = self.seconds.get(task.name, 0.0) + time.perf_counter() - self._started


def tidal_steps_per_s(episodes: int, steps: int, transport_name: str, model_dir: Path,
                      through_rollout: bool, profile=None, clock: _TaskClock | None = None) -> tuple[float, dict]:
    """Environment steps/s of one EnvActor with ``episodes`` live episodes of the GEM game.

    ``through_rollout=False``: the scripted policy (GEM's own random action) sits in the seat as a fixed
    player, as GEM's driver loop calls it. ``True``: every move is asked of a scripted rollout actor over
    tidal's streams (tokenized prompt out, completion back, an Arrow episode to a sink), as in a run.
    """
    from transformers import AutoTokenizer

    from actors.env.actor import EnvActor, EnvConfig
    from actors.rollout.scripted import serve_scripted
    from streams.channels import MemoryTransport, ZmqTransport

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    result = {}

    async def main():
        transport = MemoryTransport() if transport_name == "memory" else ZmqTransport()
        async with transport.open_receiver(capacity=4096) as requests, \
                transport.open_receiver(capacity=1024) as sink, trio.open_nursery() as nursery:
            nursery.start_soon(serve_scripted, transport, requests, _random_answers(tokenizer))
            nursery.start_soon(_drain, sink)
            env = EnvActor(EnvConfig(tokenizer_path=str(model_dir), env_name="gem:" + GEM_GAME, answer="boxed",
                                     concurrency=episodes, batch_episodes=10**9))  # admission: no limit here
            await nursery.start(env.run, transport, {"rollout": [requests.address], "reward": [sink.address]})
            if through_rollout:
                env.set_training(True)
            else:  # games with the scripted player in the one seat; far more than will be played
                env.evaluate("hosting", games_per_seat=10**7, opponent="random", player="random")
            while env.statistics()["steps"] < steps // 10:  # warm-up: every episode started
                await trio.sleep(0.01)
            first, start = env.statistics()["steps"], time.perf_counter()
            if profile is not None:  # the steady state only: not the imports, the tokenizer's load, the warm-up
                profile.enable()
            if clock is not None:
                clock.on = True
            while env.statistics()["steps"] < first + steps:
                await trio.sleep(0.01)
            if profile is not None:
                profile.disable()
            if clock is not None:
                clock.on = False
            stats = env.statistics()
            result["rate"] = (stats["steps"] - first) / (time.perf_counter() - start)
            result["stats"] = stats
            nursery.cancel_scope.cancel()

    trio.run(main, instruments=[clock] if clock is not None else [])
    return result["rate"], result["stats"]


def floor_steps_per_s(episodes: int, steps: int, model_dir: Path) -> float:
    """The generation path's own work with every structure around it taken away: one plain loop over
    ``episodes`` lanes, each tick every lane's prompt encoded, all requests framed and unframed, answered by the
    scripted rule, the completions framed and unframed and decoded in one batch, each completion's answer read in
    the answer form (``boxed``, as the path's env actor reads it), each lane's game stepped and its row written,
    and the finished episodes' Arrow tables built. No trio, no actors, no sockets: what any restructure of the path
    in Python (docs/notes/vectorised-episodes.md) would still pay per move."""
    import itertools

    from transformers import AutoTokenizer

    import envs
    from actors.env.policy_client import TokenCodec
    from envs.answers import read_answer
    from streams.messages import (GenerationRequest, decode_completions, decode_requests, encode_completions,
                                  encode_requests, split_completions, split_requests)
    from streams.schema import Columns, encode_episodes

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    codec, core = TokenCodec(tokenizer), tokenizer.backend_tokenizer
    reply = _random_answers(tokenizer)
    games = [envs.make("gem:" + GEM_GAME) for _ in range(episodes)]
    seeds = itertools.count()
    for game in games:
        game.reset(next(seeds))
    rows: list[list[dict]] = [[] for _ in games]
    ids, done, start = itertools.count(), 0, time.perf_counter()
    while done < steps:
        prompts = [codec.encode(game.observation(0)) for game in games]
        requests = [GenerationRequest(next(ids), "tcp://127.0.0.1:1", "policy", p, 1.0, 16) for p in prompts]
        asked = [r for batch in split_requests(requests) for r in decode_requests(encode_requests(batch))]
        answered = [reply(request) for request in asked]
        completions = [c for batch in split_completions(answered) for c in decode_completions(encode_completions(batch))]
        texts = core.decode_batch([c.token_ids for c in completions], skip_special_tokens=True)
        finished = []
        for lane, (game, prompt, completion, text) in enumerate(zip(games, prompts, completions, texts)):
            result = game.step(read_answer(text, "boxed", boxes=True))
            rows[lane].append({
                Columns.EPISODE_ID: str(lane), Columns.ENV_NAME: GEM_GAME, Columns.SEED: 0, Columns.POLICY_ID: "p",
                Columns.CREATED_AT: 0.0, Columns.MATCHUP: "p", Columns.TURN: len(rows[lane]), Columns.AGENT: 0,
                Columns.ROLE: "", Columns.PROMPT_IDS: prompt, Columns.ACTION_IDS: completion.token_ids,
                Columns.ACTION_TEXT: text, Columns.BEHAVIOUR_LOGPROBS: completion.logprobs,
                Columns.POLICY_VERSIONS: completion.versions, Columns.REWARD: result.rewards[0],
                Columns.TERMINATED: result.terminated, Columns.TRUNCATED: result.truncated,
                Columns.EPISODE_RETURN: 0.0, Columns.INVALID_ACTION: result.invalid, Columns.GENERATED_AT: 0.0,
                Columns.SCORED_AT: 0.0})
            done += 1
            if result.terminated or result.truncated:
                finished.append(rows[lane])
                rows[lane] = []
                game.reset(next(seeds))
        if finished:
            encode_episodes(finished)
    return done / (time.perf_counter() - start)


class _InstantPort:
    """A policy port answered by the caller between ticks (no trio, no streams): what ``LaneGroup`` asks through."""

    def __init__(self):
        import itertools

        from streams.messages import GenerationRequest

        self.asked: list = []
        self._ids, self._request = itertools.count(), GenerationRequest

    def post(self, answers, token, prompt_ids, max_tokens: int, policy: str) -> int:
        request_id = next(self._ids)
        self.asked.append((answers, token, self._request(request_id, "tcp://127.0.0.1:1", policy, prompt_ids, 1.0,
                                                         max_tokens, 0)))
        return request_id

    def cancel(self, request_id: int) -> None:
        pass


def lanes_steps_per_s(episodes: int, steps: int, model_dir: Path) -> float:
    """The lane group alone: ``LaneGroup.tick`` over ``episodes`` lanes of the GEM game, its requests answered by
    the scripted rule between ticks, each finished episode's columns taken (no trio, no streams, no Arrow, no
    admission or delivery). Against ``plain_steps_per_s``, the lane group's own bookkeeping a move: a part of the
    path ``--floor`` has no counterpart for."""
    import itertools

    from transformers import AutoTokenizer

    import envs
    from actors.env.episode import EpisodeCounts
    from actors.env.lanes import EpisodeSettings, LaneGroup
    from actors.env.policy_client import TokenCodec

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    reply, name, seeds = _random_answers(tokenizer), "gem:" + GEM_GAME, itertools.count()
    port, counts = _InstantPort(), EpisodeCounts(1)
    group = LaneGroup(port, TokenCodec(tokenizer), EpisodeSettings(env_name=name, max_new_tokens=16, answer="boxed"),
                      counts)

    def start(game) -> None:
        def ended(played) -> None:
            if played is not None:
                played[0].table_columns()
            start(game)
        group.start(game, ["p"], episode_id=f"e-{next(seeds)}", seed=next(seeds), learner="p", ended=ended)

    for _ in range(episodes):
        start(envs.make(name))

    def play(moves: int) -> int:
        first = counts.counts["steps"]
        while counts.counts["steps"] - first < moves:
            group.tick()
            asked, port.asked = port.asked, []
            for answers, token, request in asked:
                answers.put(token, reply(request))
        return counts.counts["steps"] - first

    return _timed(play, episodes, steps)


def plain_steps_per_s(episodes: int, steps: int, model_dir: Path) -> float:
    """The lane group's per-move work in a plain loop: each tick every lane's prompt encoded, its request made and
    answered by the scripted rule, the completions decoded in one batch, each answer read, each game stepped and
    its row written (the floor's loop without its frames and Arrow tables)."""
    import itertools

    from transformers import AutoTokenizer

    import envs
    from actors.env.policy_client import TokenCodec
    from envs.answers import read_answer
    from streams.messages import GenerationRequest
    from streams.schema import Columns

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    codec, core, reply = TokenCodec(tokenizer), tokenizer.backend_tokenizer, _random_answers(tokenizer)
    games, seeds, ids = [envs.make("gem:" + GEM_GAME) for _ in range(episodes)], itertools.count(), itertools.count()
    for game in games:
        game.reset(next(seeds))
    rows: list[list[dict]] = [[] for _ in games]

    def play(moves: int) -> int:
        done = 0
        while done < moves:
            prompts = [codec.encode(game.observation(0)) for game in games]
            requests = [GenerationRequest(next(ids), "tcp://127.0.0.1:1", "p", p, 1.0, 16, 0) for p in prompts]
            completions = [reply(request) for request in requests]
            texts = core.decode_batch([c.token_ids for c in completions], skip_special_tokens=True)
            for lane, (game, prompt, completion, text) in enumerate(zip(games, prompts, completions, texts)):
                result = game.step(read_answer(text, "boxed", boxes=True))
                rows[lane].append({Columns.TURN: len(rows[lane]), Columns.PROMPT_IDS: prompt,
                                   Columns.ACTION_IDS: completion.token_ids, Columns.ACTION_TEXT: text,
                                   Columns.REWARD: result.rewards[0], Columns.INVALID_ACTION: result.invalid})
                done += 1
                if result.terminated or result.truncated:
                    rows[lane] = []
                    game.reset(next(seeds))
        return done

    return _timed(play, episodes, steps)


def _timed(play, episodes: int, steps: int) -> float:
    """Moves/s of ``play(steps)``, after ``play`` warmed up every lane into an episode."""
    play(2 * episodes)
    start = time.perf_counter()
    return play(steps) / (time.perf_counter() - start)


def print_lanes(episodes: int, steps: int, rounds: int, model_dir: Path) -> None:
    """``--lanes``: the lane group's bookkeeping a move, the lane group alone against the same work in a plain
    loop, alternating; the fastest round of each counts (the least disturbed by the machine)."""
    lanes_steps_per_s(episodes, episodes, model_dir)  # untimed: what they load, then frozen
    plain_steps_per_s(episodes, episodes, model_dir)
    gc.collect()
    gc.freeze()
    group_us, plain_us = [], []
    for round_ in range(rounds):
        group_us.append(1e6 / lanes_steps_per_s(episodes, steps, model_dir))
        plain_us.append(1e6 / plain_steps_per_s(episodes, steps, model_dir))
        print(f"round {round_ + 1}: the lane group alone {group_us[-1]:.1f} us a move, the same work in a plain loop "
              f"{plain_us[-1]:.1f} us a move", flush=True)
    group, alone = min(group_us), min(plain_us)
    print(f"lanes_us={group:.1f} plain_us={alone:.1f} lanes_over_plain_us={group - alone:.1f}")


def game_steps_per_s(seconds: float) -> dict[str, float]:
    """Random legal play on each tidal environment alone (no actor): the cost of its rules."""
    from envs.registry import ENVIRONMENTS

    return {name: trio.run(_random_play, name, seconds) for name in sorted(ENVIRONMENTS)}


async def _random_play(name: str, seconds: float) -> float:
    import inspect

    import envs

    kwargs = {"latency_median_s": 0.0} if name == "tool_latency" else {}  # the rules, not the tool's wait
    game, opponent, steps, seed = envs.make(name, **kwargs), envs.make_opponent("random", seed=0), 0, 0
    game.reset(seed)
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        result = game.step(opponent.act(game))
        if inspect.isawaitable(result):
            result = await result
        steps += 1
        if result.terminated or result.truncated:
            seed += 1
            game.reset(seed)
    return steps / (time.perf_counter() - start)


# where a move's time goes: the parts of the path, each the files (a path's ending) whose own time it sums
PARTS = (
    ("lane group: the moves, rows as columns", ("actors/env/lanes.py", "actors/env/columns.py")),
    ("the game (GEM and its adapter)", ("site-packages/gem/", "envs/single_agent.py", "envs/invalid.py",
                                        "envs/gem_adapter.py", "gymnasium/")),
    ("reading answers", ("envs/answers.py", "re/__init__.py", "re/_parser.py", "re/_compiler.py")),
    ("prompts (render, tokenize, decode)", ("actors/models/chat.py", "tokenizers", "functools.py")),
    ("requests and completions (frames)", ("streams/generation_messages.py", "streams/messages.py",
                                           "actors/env/policy_client.py", "numpy/")),
    ("Arrow episodes", ("streams/schema.py", "pyarrow/")),
    ("streams (channels, frames' headers)", ("streams/endpoints.py", "streams/wire.py", "streams/memory_channels.py",
                                             "streams/zmq_", "streams/stats.py", "zmq/")),
    ("an episode's control (admission, delivery, matches)", ("actors/env/actor.py", "actors/env/admission.py",
                                                              "actors/env/deliveries.py", "actors/env/matches.py",
                                                              "actors/env/episode.py")),
    ("the scripted rollout (shares the core)", ("actors/rollout/scripted.py", "benchmarks/env_hosting.py",
                                                "random.py")),
    ("trio's scheduler", ("site-packages/trio/", "site-packages/outcome/", "<attrs generated")),
)


def parts_of(stats, moves: int) -> list[tuple[str, float, float]]:
    """(part, share of the profiled time, µs a move under the profiler) of each part, and the rest ("other"). A
    builtin's own time (a list's append, a getattr) goes to the parts of its callers, as each called it."""
    def part(file: str) -> str:
        return next((name for name, ends in PARTS if any(end in file for end in ends)), "other")

    totals = dict.fromkeys([name for name, _ in PARTS] + ["other"], 0.0)
    for (file, _, _), (_, _, own, _, callers) in stats.stats.items():
        if file != "~" or not callers:
            totals[part(file)] += own
            continue
        called = sum(by_caller[2] for by_caller in callers.values()) or 1.0
        for (caller_file, _, _), by_caller in callers.items():
            totals[part(caller_file)] += own * by_caller[2] / called
    whole = sum(totals.values()) or 1.0
    return [(name, t / whole, 1e6 * t / max(moves, 1)) for name, t in sorted(totals.items(), key=lambda x: -x[1])]


def profile_generation_path(episodes: int, steps: int, transport: str, model_dir: Path, top: int, path: Path) -> None:
    """cProfile of the generation path's steady state (after the warm-up): each part's share of a move's time
    (``PARTS``), then the ``top`` functions by their own time and by cumulative time, printed and written to
    ``path``."""
    import cProfile
    import io
    import pstats

    clock = _TaskClock()
    rate, stats = tidal_steps_per_s(episodes, steps, transport, model_dir, through_rollout=True, clock=clock)
    out = io.StringIO()
    out.write(f"generation path, {episodes} episodes, {steps} steps, no profiler: {rate:,.0f} steps/s "
              f"({1e6 / rate:.1f} us a move); wall time by trio task (the rest: the scheduler, and waiting):\n")
    for name, seconds in sorted(clock.seconds.items(), key=lambda item: -item[1])[:10]:
        out.write(f"  {1e6 * seconds / steps:7.1f} us a move  {'.'.join(name.split('.')[-2:])}\n")
    profile = cProfile.Profile()
    rate, _ = tidal_steps_per_s(episodes, steps, transport, model_dir, through_rollout=True, profile=profile)
    out.write(f"the same under cProfile: {rate:,.0f} steps/s\n"
              "where a move's time goes (own time of each part's functions; the profiler's cost included, so "
              "parts made of many small calls weigh more than they do without it):\n")
    for name, share, micros in parts_of(pstats.Stats(profile), steps):
        out.write(f"  {share:6.1%}  {micros:7.1f} us a move  {name}\n")
    for order in ("tottime", "cumulative"):
        pstats.Stats(profile, stream=out).strip_dirs().sort_stats(order).print_stats(top)
    path.write_text(out.getvalue())
    print(out.getvalue())
    print(f"written to {path}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps: about a minute")
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=None, help="environment steps per side")
    parser.add_argument("--transport", choices=["memory", "zmq"], default="memory")
    parser.add_argument("--rounds", type=int, default=3, help="GEM and tidal alternate; medians are reported")
    parser.add_argument("--profile", type=Path, default=None, metavar="FILE",
                        help="only profile the generation path (cProfile, steady state) and write its top functions")
    parser.add_argument("--lanes", action="store_true",
                        help="only the lane group alone against the same per-move work in a plain loop")
    parser.add_argument("--floor", action="store_true",
                        help="only GEM against the generation path's own work in one plain loop (floor_steps_per_s)")
    args = parser.parse_args(argv)
    steps = args.steps or (10_000 if args.quick else 60_000)
    logging.basicConfig(level=logging.WARNING)

    from actors.models.base_model import ensure_base_model, tiny_model_config
    from actors.cli import load_config

    cfg = load_config([])  # the default job's tiny model: only its tokenizer is used
    model_dir = ensure_base_model(cfg.model.cache_dir, tiny_model_config(cfg))
    import gem  # noqa: F401 (loaded before the freeze, as the env actors load it)

    # An env actor freezes what it loaded and sets the collector's thresholds (its first run would, here): from then
    # on no full collection walks torch and transformers, GEM's threads' included. Done before anything is timed, so
    # that GEM, tidal and the floor run alike.
    from actors.env.actor import freeze_what_is_loaded

    freeze_what_is_loaded()
    if args.profile:
        return profile_generation_path(args.episodes, steps, args.transport, model_dir, 40, args.profile)
    if args.lanes:
        return print_lanes(args.episodes, steps, max(args.rounds, 5), model_dir)
    if args.floor:
        return print_floor(args.episodes, steps, args.rounds, model_dir)
    floor_steps_per_s(args.episodes, args.episodes, model_dir)  # untimed: what the floor's loop loads, then frozen
    gc.collect()
    gc.freeze()
    # GEM, both tidal paths and the floor take turns, so a change in the machine's load falls on all; medians of rounds
    gem_rates, tidal_rates, path_rates, floor_rates = [], [], [], []
    for round_ in range(args.rounds):
        gem_rates.append(gem_steps_per_s(args.episodes, steps))
        rate, stats = tidal_steps_per_s(args.episodes, steps, args.transport, model_dir, through_rollout=False)
        tidal_rates.append(rate)
        path_rate, path_stats = tidal_steps_per_s(args.episodes, steps, args.transport, model_dir, through_rollout=True)
        path_rates.append(path_rate)
        floor_rates.append(floor_steps_per_s(args.episodes, steps, model_dir))
        per_frame = path_stats["turns"] / max(path_stats["request_frames"], 1)
        print(f"round {round_ + 1}: GEM AsyncVectorEnv {gem_rates[-1]:,.0f} steps/s, tidal EnvActor {rate:,.0f} "
              f"steps/s (ratio {rate / gem_rates[-1]:.2f}; {stats['episodes']} episodes, {stats['errored']} errored), "
              f"generation path {path_rate:,.0f} steps/s (ratio {path_rate / gem_rates[-1]:.2f}; "
              f"{per_frame:.0f} requests a frame, {path_stats['errored']} errored), floor {floor_rates[-1]:,.0f} "
              f"steps/s (path over floor {path_rate / floor_rates[-1]:.2f})", flush=True)
    gem_rate, tidal_rate = statistics.median(gem_rates), statistics.median(tidal_rates)
    path_rate, floor_rate = statistics.median(path_rates), statistics.median(floor_rates)
    print(f"GEM AsyncVectorEnv, {args.episodes} envs of {GEM_GAME}: {gem_rate:,.0f} steps/s (median)")
    print(f"tidal EnvActor, {args.episodes} live episodes of gem:{GEM_GAME}, scripted player in the seat: "
          f"{tidal_rate:,.0f} steps/s (median)")
    print(f"tidal EnvActor, the same, every move asked of a scripted rollout over {args.transport} streams "
          f"(tokenize, request, completion, Arrow episode): {path_rate:,.0f} steps/s (median; "
          f"{path_stats['prompt_cache_hits']} prompt-cache hits in the last round)", flush=True)
    print(f"the floor: the generation path's own work in one plain loop: {floor_rate:,.0f} steps/s (median)")
    for name, rate in game_steps_per_s(1.0 if args.quick else 3.0).items():
        print(f"  {name:<14} {rate:>10,.0f} steps/s (rules alone, random legal play)")
    print(f"vs_gem={tidal_rate / gem_rate:.2f} generation_path_vs_gem={path_rate / gem_rate:.2f} "
          f"generation_path_vs_floor={path_rate / floor_rate:.2f} tidal_steps_per_s={tidal_rate:.0f}")


def print_floor(episodes: int, steps: int, rounds: int, model_dir: Path) -> None:
    floor_steps_per_s(episodes, episodes, model_dir)  # untimed: what the loop imports and loads, then frozen as an
    gc.collect()  # env actor freezes what it loaded; left in the collector's reach, it slowed GEM's rounds by a third
    gc.freeze()
    gem_rates, floor_rates = [], []
    for round_ in range(rounds):
        gem_rates.append(gem_steps_per_s(episodes, steps))
        floor_rates.append(floor_steps_per_s(episodes, steps, model_dir))
        print(f"round {round_ + 1}: GEM AsyncVectorEnv {gem_rates[-1]:,.0f} steps/s, the generation path's own work "
              f"in one loop {floor_rates[-1]:,.0f} steps/s (ratio {floor_rates[-1] / gem_rates[-1]:.2f})", flush=True)
    gem_rate, floor_rate = statistics.median(gem_rates), statistics.median(floor_rates)
    print(f"floor_vs_gem={floor_rate / gem_rate:.2f} floor_steps_per_s={floor_rate:.0f} gem_steps_per_s={gem_rate:.0f}")


if __name__ == "__main__":
    main()
