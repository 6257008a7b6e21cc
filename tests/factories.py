"""What the tests build, in one place: trajectory rows, episodes and tables; fake clusters and toy actors; an env
actor against a scripted policy; waits on progress; small run configs and a run going on in a thread.

No test module imports another: what two tests share lives here. Every row starts from `row` (one honest row of
the trajectory schema); the other builders are named for the shape they give it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import random
import struct
import threading
import time
from dataclasses import dataclass

import pyarrow as pa
import trio
from transformers import AutoTokenizer

from actors.env.actor import EnvActor, EnvConfig
from actors.rollout.scripted import serve_scripted
from envs.kuhn_poker import KuhnPoker
from streams.channels import MemoryTransport
from streams.endpoints import Inbox
from streams.messages import Completion
from streams.schema import Columns as C
from streams.schema import decode_table, encode_table, trajectory_table
from streams.wire import Kind


# -- rows, episodes and tables -------------------------------------------------------------------------------

def row(episode="env-0-1", turn=0, **changes) -> dict:
    """One honest row of the trajectory schema, with ``changes`` (column name -> value) applied."""
    base = {C.EPISODE_ID: episode, C.ENV_NAME: "t", C.SEED: 0, C.TURN: turn, C.AGENT: 0, C.MATCHUP: "main",
            C.POLICY_ID: "main", C.PROMPT_IDS: [3, 4, 5], C.ACTION_IDS: [6, 7], C.ACTION_TEXT: "[1]",
            C.BEHAVIOUR_LOGPROBS: [-0.5, -1.5], C.POLICY_VERSIONS: [2, 3], C.REWARD: 1.0, C.TERMINATED: False,
            C.TRUNCATED: False, C.EPISODE_RETURN: 1.0, C.INVALID_ACTION: False, C.CREATED_AT: 1.0,
            C.GENERATED_AT: 2.0, C.SCORED_AT: 3.0}
    return {**base, **changes}


_ZERO_TIMES = {C.CREATED_AT: 0.0, C.GENERATED_AT: 0.0, C.SCORED_AT: 0.0}


POISON = {  # reason -> a row that must be refused for it (each beside honest rows)
    "null": row(**{C.EPISODE_ID: None}),
    "missing_id": row(**{C.EPISODE_ID: ""}),
    "empty_prompt": row(**{C.PROMPT_IDS: []}),
    "no_action": row(**{C.ACTION_IDS: [], C.BEHAVIOUR_LOGPROBS: [], C.POLICY_VERSIONS: []}),
    "ragged": row(**{C.BEHAVIOUR_LOGPROBS: [-0.5]}),
    "token_id": row(**{C.ACTION_IDS: [6, 1000]}),
    "non_finite": row(**{C.REWARD: math.nan}),
    "logprob": row(**{C.BEHAVIOUR_LOGPROBS: [-0.5, 0.7]}),
    "version": row(**{C.POLICY_VERSIONS: [2, -1]}),
}


def sampled_row(prompt, sampled, version=0, seat=0, ret=1.0, episode="e0", matchup="main,main") -> dict:
    """A terminal tictactoe row of ``sampled`` (tokens and log-probs, as the sampler returns them) after
    ``prompt``, every token of policy version ``version``, returning ``ret``."""
    return row(episode, **{C.ENV_NAME: "tictactoe", C.AGENT: seat, C.MATCHUP: matchup, C.PROMPT_IDS: prompt,
                           C.ACTION_IDS: sampled.tokens, C.ACTION_TEXT: "", C.BEHAVIOUR_LOGPROBS: sampled.logprobs,
                           C.POLICY_VERSIONS: [version] * len(sampled.tokens), C.REWARD: ret, C.TERMINATED: True,
                           C.EPISODE_RETURN: ret, **_ZERO_TIMES})


def prompt_row(turn: int, prompt: int) -> dict:
    """A two-token turn after a prompt of ``prompt`` tokens (0, 1, ...)."""
    return row(turn=turn, **{C.PROMPT_IDS: list(range(prompt)), C.ACTION_IDS: [1, 2], C.ACTION_TEXT: "",
                             C.BEHAVIOUR_LOGPROBS: [-0.5, -0.5], C.POLICY_VERSIONS: [0, 0], C.REWARD: 0.0,
                             C.EPISODE_RETURN: 0.0, **_ZERO_TIMES})


def versions_episode(name: str, versions: list[list[int]]) -> pa.Table:
    """An episode with a turn for each list of ``versions``: one action token sampled at each version."""
    return trajectory_table([row(name, turn, **{
        C.ENV_NAME: "test", C.PROMPT_IDS: [1], C.ACTION_IDS: [2] * len(v), C.ACTION_TEXT: "",
        C.BEHAVIOUR_LOGPROBS: [-1.0] * len(v), C.POLICY_VERSIONS: v, C.REWARD: 0.0, C.EPISODE_RETURN: 0.0,
        **_ZERO_TIMES}) for turn, v in enumerate(versions)])


def turns_episode(name="env-0-1", turns=((0, "[1]"),), env="t") -> pa.Table:
    """An episode of (agent, action text) turns."""
    return trajectory_table([row(name, turn=t, **{C.AGENT: agent, C.ACTION_TEXT: text, C.ENV_NAME: env,
                                                  C.PROMPT_IDS: [3, t + 4]})
                             for t, (agent, text) in enumerate(turns)])


def random_table(seed: int, vocab: int, rows: int = 24) -> pa.Table:
    """``rows`` terminal two-seat turns of random prompts and actions below ``vocab`` (seeded)."""
    rng = random.Random(seed)
    out = []
    for i in range(rows):
        n = rng.randint(1, 6)
        out.append(row(f"e{seed}-{i // 2}", i % 2, **{
            C.AGENT: i % 2, C.MATCHUP: "self",
            C.PROMPT_IDS: [rng.randrange(2, vocab) for _ in range(rng.randint(2, 16))],
            C.ACTION_IDS: [rng.randrange(2, vocab) for _ in range(n)], C.ACTION_TEXT: "",
            C.BEHAVIOUR_LOGPROBS: [-rng.uniform(1, 5) for _ in range(n)],
            C.POLICY_VERSIONS: [0] * n, C.REWARD: rng.choice([-1.0, 1.0]), C.TERMINATED: True,
            C.EPISODE_RETURN: rng.choice([-1.0, 1.0]), **_ZERO_TIMES}))
    return trajectory_table(out)


def largest_difference(a: dict, b: dict) -> float:
    """The largest absolute difference between two state dicts' tensors (same keys)."""
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


# -- Arrow bodies a receiver must refuse ---------------------------------------------------------------------

def bad_middle_offset() -> bytes:
    """An honest three-turn episode whose prompt_ids offsets [0, 101, 304, 611] became [0, 101, 2**31 - 65536, 611]:
    the first and last offsets, which Arrow's light validation checks, are intact."""
    body = bytearray(encode_table(trajectory_table([prompt_row(0, 101), prompt_row(1, 203), prompt_row(2, 307)])))
    offsets = struct.pack("<4i", 0, 101, 304, 611)
    at = body.find(offsets)
    assert at >= 0 and body.find(offsets, at + 1) < 0
    body[at + 8:at + 12] = struct.pack("<i", 0x7FFF0000)
    return bytes(body)


def compressed(table: pa.Table) -> bytes:
    """``table`` as a zstd-compressed IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


# -- games ---------------------------------------------------------------------------------------------------

def kuhn(cards, moves):
    """A Kuhn Poker game dealt ``cards``, played through ``moves``: (the game, the last step's result)."""
    game = KuhnPoker()
    game.reset(0)
    game.cards = list(cards)
    result = None
    for move in moves:
        result = game.step(f"[{move}]")
    return game, result


# -- actors and clusters -------------------------------------------------------------------------------------

def admit_all(admission, member: str = "main") -> int:
    """Start episodes of ``member`` until admission refuses one; how many started."""
    started = 0
    while member in admission.admitted():
        admission.started(member)
        started += 1
    return started


class FakeCluster:
    """Records restarts and calls; every actor answers its statistics with its name."""

    def __init__(self):
        self.restarted, self.calls = [], []

    def restart(self, name, **changes):
        self.restarted.append((name, changes))
        return {"version": 3, "cursor": 5}

    def call(self, name, method, *args):
        self.calls.append((name, method, *args))
        return 1

    def statistics(self, name):
        return {"name": name, "cursor": 5, "received_by_source": {"env-0": 7}, "matches": 10}

    def is_dead(self, error):
        return True


@dataclass
class TickerConfig:
    """A ``Ticker``'s config: nothing to set, but a dataclass, as a cluster's ``restart`` replaces its fields."""


class Ticker:
    """A toy actor: a task that counts, and one that raises once ``poke`` is called (a bug in its own loop; or,
    with ``poke("disk")``, a write that met a full disk)."""

    def __init__(self, cfg, name: str = "ticker"):
        self.name, self.ticks, self._poked, self._fault = name, 0, None, "bug"

    async def run(self, transport, peers: dict, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self._poked = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._fail_when_poked)
            task_status.started({})
            while True:
                self.ticks += 1
                await trio.sleep(0.01)

    async def _fail_when_poked(self) -> None:
        await self._poked.wait()
        if self._fault == "disk":
            raise OSError(errno.ENOSPC, "No space left on device", "/runs/r/replay/life/batches.jsonl")
        raise ValueError("a bug in the ticker")

    def poke(self, fault: str = "bug") -> None:
        self._fault = fault
        self._poked.set()

    def statistics(self) -> dict:
        return {"ticks": self.ticks}


async def scripted_rollout(transport, receiver, tokenizer, answer, version: int = 5, requests: list | None = None):
    """Answers every generation request with ``answer`` (a text, or a function of the prompt's text), as
    version ``version`` of the policy; keeps each request in ``requests`` if given."""
    script = answer if callable(answer) else lambda prompt: answer

    def reply(request):
        if requests is not None:
            requests.append(request)
        tokens = tokenizer(script(tokenizer.decode(request.prompt_ids)))["input_ids"] + [tokenizer.eos_token_id]
        return Completion(request.request_id, tokens, [-0.5] * len(tokens), [version] * len(tokens), True)

    await serve_scripted(transport, receiver, reply)


@contextlib.asynccontextmanager
async def scripted_env(tiny_model_dir, answer, version: int, **env_args):
    """An env actor (``env_args``) whose policy is scripted to answer ``answer`` as ``version``, and the inbox of
    the episodes it delivers; cancelled on exit."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    transport = MemoryTransport()
    async with transport.open_receiver() as requests, transport.open_receiver() as rewards, \
            trio.open_nursery() as nursery:
        nursery.start_soon(scripted_rollout, transport, requests, tokenizer, answer, version, None)
        env = EnvActor(EnvConfig(tokenizer_path=str(tiny_model_dir), **env_args))
        await nursery.start(env.run, transport, {"rollout": [requests.address], "reward": [rewards.address]})
        yield env, Inbox(rewards, Kind.EPISODES, decode_table)
        nursery.cancel_scope.cancel()


def run_episodes(tiny_model_dir, answer, /, episodes: int, clock=None, record_requests=None, concurrency=4,
                 rollout=scripted_rollout, **env_args):
    """``episodes`` training episodes of an env actor against a scripted policy, then its statistics."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tables = []

    async def main():
        transport = MemoryTransport()
        async with transport.open_receiver() as requests, transport.open_receiver() as rewards, \
                trio.open_nursery() as nursery:
            nursery.start_soon(rollout, transport, requests, tokenizer, answer, 5, record_requests)
            env = EnvActor(EnvConfig(tokenizer_path=str(tiny_model_dir), concurrency=concurrency, **env_args))
            await nursery.start(env.run, transport, {"rollout": [requests.address], "reward": [rewards.address]})
            env.set_training(True)
            inbox = Inbox(rewards, Kind.EPISODES, decode_table)
            while len(tables) < episodes:
                tables.append(await inbox.receive())
            tables.append(env.statistics())
            nursery.cancel_scope.cancel()

    trio.run(main, clock=clock)
    return tables


# -- waiting on progress ----------------------------------------------------------------------------------

QUIET_S = 0.3  # how long "nothing arrives" is watched for


async def assert_quiet(receiver) -> None:
    with trio.move_on_after(QUIET_S):
        extra = await receiver.receive()
        raise AssertionError(f"unexpected message {extra!r}")


async def wait_in_flight(sender, unchanged: int) -> int:
    """The sender's unacknowledged count once it is no longer ``unchanged``."""
    with trio.fail_after(10):
        while sender.statistics()["in_flight"] == unchanged:
            await trio.sleep(0.01)
    return sender.statistics()["in_flight"]


def wait_for(predicate, what: str, timeout: float = 120.0):
    """Poll ``predicate`` until it returns a truthy value (progress, not timing: the deadline is generous)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


# -- runs --------------------------------------------------------------------------------------------------

def small_config(run_dir, **overrides) -> dict:
    """The default job's config, shaped small: eight episodes a batch, four games a seat, four new tokens."""
    from actors.cli import load_config

    args = [f"run.dir={run_dir}", "run.name=test", "run.progress=false", "replay.args.batch_episodes=8",
            "replay.args.capacity_episodes=16", "env.args.concurrency=8", "eval.every_s=0",
            "eval.games_per_seat=4", "eval.endpoint_games_per_seat=4", "sampling.max_new_tokens=4"]
    return load_config(args + [f"{k}={v}" for k, v in overrides.items()])


class BackgroundRun:
    """``Driver(cfg)`` executing in a thread, for tests that act on a run while it goes on."""

    def __init__(self, cfg: dict):
        from actors.runs.driver import Driver

        self.run, self.outcome = Driver(cfg), {}
        self.thread = threading.Thread(target=lambda: self.outcome.setdefault("summary", self.run.execute()))
        self.thread.start()

    def last_row(self, empty: dict) -> dict:
        """The run's last metrics row (``empty`` before the first); fails if the run already ended."""
        assert self.thread.is_alive(), "the run ended early"
        metrics = self.run.dir / "metrics.jsonl"
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        return json.loads(lines[-1]) if lines else empty

    def rows(self) -> list[dict]:
        return [json.loads(line) for line in (self.run.dir / "metrics.jsonl").read_text().splitlines()]

    def join(self, timeout: float) -> dict | None:
        """Wait for the run to end; its summary."""
        self.thread.join(timeout)
        return self.outcome.get("summary")


def dataset_accounts(run) -> dict:
    """DuckDB on a run's episode dataset: distinct episodes per life, the ids found in more than one batch, and the
    episodes its learner trained (its last checkpoint's count): each trained episode once means ``sum(per_life)
    == trained`` and no id twice."""
    import duckdb
    import torch

    from actors.models.checkpoint_dir import TRAINER_STATE, find_checkpoint

    files = f"{run}/episodes/*/*/*.parquet"
    per_life = dict(duckdb.sql(f"select life, count(distinct episode_id) from read_parquet('{files}') group by life")
                    .fetchall())
    twice = duckdb.sql(f"select episode_id from read_parquet('{files}') group by member, episode_id "
                       "having count(distinct (life, batch_seq)) > 1").fetchall()
    trained = torch.load(find_checkpoint(run / "policy") / TRAINER_STATE, weights_only=True)["totals"]["episodes"]
    return {"per_life": per_life, "twice": [i for (i,) in twice], "trained": trained}
