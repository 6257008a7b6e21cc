"""Well-typed poison through a live reward -> replay -> learner pipeline and a league: is any of it kept?

Every actor runs in this process on one trio loop (``LocalCluster``) over real ZeroMQ sockets: a learner on a
tiny model, its replay (spilling to disk, told the model's vocabulary, following the learner's versions) and its
reward actor, and a league. ``run`` plays the env actors: it sends episodes to the reward actor, each an
honest turn and a poisoned one of every class (a null or empty episode id, a repeated turn, a null token, ragged
per-token lists, token ids beyond the vocabulary or negative, NaN and infinite rewards, returns and log-probs,
negative and huge versions, no action token, a positive log-prob, more tokens than the model's context, a reward
or return of 3e38), episodes that are poison only, honest episodes, and two bad Arrow bodies (a bad middle
offset, zstd compression) to reward and to replay; one batch of every class straight to the learner, as a hostile
sender on its socket would (nothing upstream has checked it); and match results to the league, honest ones and
poisoned ones (a learner that holds no seat or is no member, the wrong number of seats, a NaN or infinite return).

Every poisoned row is marked (its ``action_text``), so the scan needs no check of the pipeline's own: once the
learner has trained everything replay could batch, it reads every record of replay's spill files, every table the
learner passed to ``collate`` (what reached the model), and the league's journal, and counts the poison it finds
there. A league restarted from its state and journal must then load. ``run`` returns the counts:
`tests/system/test_poison_benchmark.py` asserts on them, `benchmarks/poison.py` and `benchmarks/stream_fuzz.py`
print ``poison_kept`` in their last lines.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import trio

import actors.learner.trainer
from actors.models.base_model import TinyModelConfig, ensure_base_model
from actors.runs.host import LocalCluster
from actors.league.actor import JOURNAL_FILE, LeagueActor, LeagueConfig
from actors.learner.actor import LearnerActor, LearnerConfig
from actors.replay.actor import ReplayActor, ReplayConfig
from actors.reward.actor import RewardActor, RewardConfig
from actors.runs.topology import model_context, model_vocab_size
from streams.channels import ZmqTransport
from streams.endpoints import Outbox
from streams.messages import MatchResult
from streams.schema import Columns as C
from streams.schema import encode_table, trajectory_table
from streams.wire import Kind

MODEL = TinyModelConfig(warmup_games=50, warmup_steps=1, warmup_batch=8)  # as the fuzzer's: weights do not matter
MARK = "POISON "  # the action_text of every poisoned row
BATCH_EPISODES = 4
POISON_MATCHES = 1_000_000  # poisoned match results are numbered from here


def turn(episode: str, index: int, **changes) -> dict:
    n = 2 + index % 3
    base = {C.EPISODE_ID: episode, C.ENV_NAME: "tictactoe", C.SEED: index, C.TURN: index, C.AGENT: index % 2,
            C.MATCHUP: "main,main", C.POLICY_ID: "main", C.PROMPT_IDS: [5 + (index + k) % 40 for k in range(6)],
            C.ACTION_IDS: [7 + (index * k) % 40 for k in range(n)], C.ACTION_TEXT: "[5]",
            C.BEHAVIOUR_LOGPROBS: [-1.5] * n, C.POLICY_VERSIONS: [0] * n, C.REWARD: 1.0 - 2 * (index % 2),
            C.TERMINATED: index == 1, C.TRUNCATED: False, C.EPISODE_RETURN: 1.0 - 2 * (index % 2),
            C.INVALID_ACTION: False, C.CREATED_AT: 1.0, C.GENERATED_AT: 2.0, C.SCORED_AT: 0.0}
    return {**base, **changes}


def poison_turns(vocab: int, context: int) -> dict[str, dict]:
    """Each class of poison: the changes that make turn 1 of an episode poisonous (``context``: the model's)."""
    n = 3  # turn 1 has 3 action tokens
    return {**LEARNER_UNBOUNDED,
        "null_id": {C.EPISODE_ID: None}, "empty_id": {C.EPISODE_ID: ""}, "repeated_turn": {C.TURN: 0, C.AGENT: 0},
        "null_token": {C.ACTION_IDS: [7, None, 9]}, "null_reward": {C.REWARD: None},
        "ragged_logprobs": {C.BEHAVIOUR_LOGPROBS: [-1.5]}, "ragged_versions": {C.POLICY_VERSIONS: [0] * (n + 2)},
        "action_beyond_vocab": {C.ACTION_IDS: [7, 8, vocab]}, "prompt_beyond_vocab": {C.PROMPT_IDS: [5, vocab + 99]},
        "negative_token": {C.ACTION_IDS: [7, -3, 9]}, "nan_reward": {C.REWARD: math.nan},
        "inf_reward": {C.REWARD: math.inf}, "nan_return": {C.EPISODE_RETURN: math.nan},
        "nan_logprob": {C.BEHAVIOUR_LOGPROBS: [-1.5, math.nan, -1.5]},
        "inf_logprob": {C.BEHAVIOUR_LOGPROBS: [-math.inf, -1.5, -1.5]},
        "negative_version": {C.POLICY_VERSIONS: [0, -1, 0]},
        "huge_version": {C.POLICY_VERSIONS: [0, 0, 2**31 - 1]}, "version_ahead": {C.POLICY_VERSIONS: [1000] * n},
        "no_action": {C.ACTION_IDS: [], C.BEHAVIOUR_LOGPROBS: [], C.POLICY_VERSIONS: []},
        "positive_logprob": {C.BEHAVIOUR_LOGPROBS: [-1.5, 2.0, -1.5]},
        "beyond_context": {C.PROMPT_IDS: [5] * (context - n + 1)},
    }


# Classes the reward actor refuses (reward.args.max_abs) and the learner does not: it does not know that bound, and
# its defence against them is its baselines' (algos/advantages.py), so they are not in the batch sent to it straight.
LEARNER_UNBOUNDED = {"huge_reward": {C.REWARD: 3e38}, "huge_return": {C.EPISODE_RETURN: -3e38}}


def episodes(rounds: int, vocab: int, context: int) -> tuple[list[pa.Table], int, int]:
    """The episodes to send (poisoned, poison only, honest), their poisoned rows and their honest rows."""
    tables, poison, honest = [], 0, 0
    for r in range(rounds):
        for name, changes in poison_turns(vocab, context).items():
            rows = [turn(f"env-{r}-{name}", 0), turn(f"env-{r}-{name}", 1, **{C.ACTION_TEXT: MARK + name}, **changes)]
            tables.append(trajectory_table(rows))
            poison, honest = poison + 1, honest + 1
        bad = [turn(f"env-{r}-all-bad", i, **{C.ACTION_TEXT: MARK + "all"}, **{C.REWARD: math.nan}) for i in range(2)]
        tables.append(trajectory_table(bad))
        poison += 2
        for i in range(3):
            tables.append(trajectory_table([turn(f"env-{r}-honest{i}", 0), turn(f"env-{r}-honest{i}", 1)]))
            honest += 2
    return tables, poison, honest


def straight_batch(vocab: int, context: int) -> tuple[pa.Table, int]:
    """A batch for the learner itself: an honest episode, and every class of poison the learner bounds as turn 1
    of an episode."""
    rows = [turn("env-y-honest", 0), turn("env-y-honest", 1)]
    classes = {name: changes for name, changes in poison_turns(vocab, context).items()
               if name not in LEARNER_UNBOUNDED}
    for name, changes in classes.items():
        rows += [turn(f"env-y-{name}", 0), turn(f"env-y-{name}", 1, **{C.ACTION_TEXT: MARK + name}, **changes)]
    return trajectory_table(rows), len(classes)


def bad_bodies() -> list[bytes]:
    """A marked episode with a bad middle offset (it crashed the learner), and the same compressed with zstd."""
    table = trajectory_table([turn("env-x-frame", i, **{C.ACTION_TEXT: MARK + "frame",
                                                         C.PROMPT_IDS: list(range(5, 5 + 37 * (i + 1)))})
                              for i in range(3)])
    body = bytearray(encode_table(table))
    offsets = b"".join(int(v).to_bytes(4, "little") for v in (0, 37, 111, 222))
    at = body.find(offsets)
    body[at + 8:at + 12] = (0x7FFF0000).to_bytes(4, "little")
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as writer:
        writer.write_table(table)
    return [bytes(body), sink.getvalue().to_pybytes()]


def match_results() -> tuple[list[MatchResult], int]:
    honest = [MatchResult(i, "main", ["main", "exploiter"] if i % 2 else ["exploiter", "main"], [1.0, -1.0])
              for i in range(6)]
    p = POISON_MATCHES
    poison = [MatchResult(p, "main", ["exploiter", "random"], [1.0, -1.0]),  # the learner holds no seat
              MatchResult(p + 1, "ghost", ["ghost", "main"], [1.0, -1.0]),  # no member
              MatchResult(p + 2, "main", ["main", "exploiter", "random"], [1.0, 0.0, -1.0]),  # 3 seats, 2 players
              MatchResult(p + 3, "main", ["main", "exploiter"], [math.nan, 0.0]),
              MatchResult(p + 4, "exploiter", ["exploiter", "main"], [math.inf, -1.0])]
    return honest[:3] + poison + honest[3:], len(poison)


def marked(table: pa.Table) -> int:
    return sum(1 for text in table.column(C.ACTION_TEXT).to_pylist() if text and text.startswith(MARK))


def spilled(directory: Path) -> list[pa.Table]:
    """Every record in the spill files, read raw (not through replay's own loading)."""
    tables = []
    for path in sorted(directory.glob("episodes-*.arrows")):
        with pa.OSFile(str(path)) as f:
            reader = pa.ipc.open_stream(f)
            tables += [pa.Table.from_batches([b]) for b in reader]
    return tables


def wait_until(predicate, timeout: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def run(rounds: int = 2, quiet: bool = False, model: str | None = None) -> dict:
    """Send the poison, wait for the learner to train what replay can batch, and scan; the counts. ``model``: a
    model directory (default: the fuzzer's tiny model, made once in ~/.cache/tidal/models)."""
    say = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
    model = model or str(ensure_base_model("~/.cache/tidal/models", MODEL))
    vocab, context = model_vocab_size(model), model_context(model)
    trained: list[pa.Table] = []
    collate = actors.learner.trainer.collate

    def recording_collate(table, pad_id):  # what reaches the model, exactly
        trained.append(table)
        return collate(table, pad_id)

    with tempfile.TemporaryDirectory(prefix="tidal-poison-") as scratch:
        root = Path(scratch)
        cluster = LocalCluster(transport="zmq")
        actors.learner.trainer.collate = recording_collate
        try:
            learner = cluster.spawn("learner", LearnerActor, LearnerConfig(
                model_path=model, max_staleness=10**6, announce_every_s=0.2), peers={})
            replay = cluster.spawn("replay", ReplayActor, ReplayConfig(
                batch_episodes=BATCH_EPISODES, capacity_episodes=64, spill_dir=str(root / "replay"), vocab_size=vocab,
                max_row_tokens=context),
                peers={"learner": [learner["batches"]], "versions": [learner["weights"]]})
            reward = cluster.spawn("reward", RewardActor, RewardConfig(), peers={"replay": [replay["episodes"]]})
            league = cluster.spawn("league", LeagueActor, LeagueConfig(
                members=[{"id": "main", "role": "main"}, {"id": "exploiter", "role": "main_exploiter"}],
                state_dir=str(root / "league")), peers={})
            tables, poison_rows, honest_rows = episodes(rounds, vocab, context)
            results, poison_results = match_results()
            frames = bad_bodies()
            batch, poison_in_batch = straight_batch(vocab, context)

            async def send():
                with trio.move_on_after(60) as late:  # a receiver that died takes no more
                    await send_all()
                if late.cancelled_caught:
                    say("poison: not everything could be sent (a receiver stopped taking it)")

            async def send_all():
                transport = ZmqTransport()
                async with (transport.open_sender([reward["episodes"]]) as to_reward,
                            transport.open_sender([replay["episodes"]]) as to_replay,
                            transport.open_sender([league["results"]]) as to_league,
                            transport.open_sender([learner["batches"]]) as to_learner):
                    env, straight = Outbox(to_reward, Kind.EPISODES, "env-0"), Outbox(to_replay, Kind.EPISODES, "env")
                    for body in frames:
                        await env.send(body)
                        await straight.send(body)
                    for table in tables:
                        await env.send(encode_table(table))
                    league_out = Outbox(to_league, Kind.MATCH_RESULT, "env-0")
                    for result in results:
                        await league_out.send(result.to_body())
                    await Outbox(to_learner, Kind.BATCH, "replay").send(encode_table(batch))  # no number: in order
                    for channel in (to_reward, to_replay, to_league, to_learner):
                        await channel.drain()

            def stat(name: str, key: str, default=None):
                try:
                    return cluster.statistics(name)[key]
                except Exception:  # noqa: BLE001 - the actor's loop has died: a crash, reported below
                    return default

            wait_until(lambda: stat("replay", "learner_version") is not None, 60)
            trio.run(send)
            kept = len(tables) - rounds  # the poison-only episode of each round is refused whole
            if not wait_until(lambda: stat("replay", "episodes_in", 0) >= kept
                              and stat("league", "results", 0) >= len(results) - poison_results, 60):
                say("poison: the pipeline did not take every honest episode in time")
            batches = kept // BATCH_EPISODES + 1  # and the one sent straight to the learner
            wait_until(lambda: stat("learner", "version", batches) >= batches, 60)
            stats = {}
            for name in ("reward", "replay", "learner", "league"):
                try:
                    stats[name] = cluster.statistics(name)
                except Exception as error:  # noqa: BLE001
                    stats[name] = {"crashed": repr(error)[:200]}
            learner_rejected, skipped = {}, 0
            for update in cluster.actors["learner"].history:
                skipped += update.get("skipped_steps", 0)
                for reason, n in update.get("rejected_by_reason", {}).items():
                    learner_rejected[reason] = learner_rejected.get(reason, 0) + n
        finally:
            cluster.shutdown()
            actors.learner.trainer.collate = collate
        in_spill = sum(marked(t) for t in spilled(root / "replay"))
        in_batches = sum(marked(t) for t in trained)
        journal = [json.loads(line) for line in (root / "league" / JOURNAL_FILE).read_text().splitlines()]
        in_journal = sum(entry[0] >= POISON_MATCHES for entry in journal)
        resumed = LeagueActor(LeagueConfig(members=[{"id": "main", "role": "main"},
                                                    {"id": "exploiter", "role": "main_exploiter"}],
                                           state_dir=str(root / "league"), resume=True)).table()["matches"]
        honest_spilled = sum(t.num_rows - marked(t) for t in spilled(root / "replay"))
    outcome = {
        "poison_rows": poison_rows + len(frames) * 3 * 2 + poison_in_batch + poison_results,
        "poison_kept": in_spill + in_batches + in_journal,
        "in_spill": in_spill, "in_trained_batches": in_batches, "in_journal": in_journal,
        "honest_rows": honest_rows, "honest_spilled": honest_spilled,
        "trained_batches": len(trained), "trained_rows": sum(t.num_rows for t in trained),
        "league_matches_after_resume": resumed,
        "rejected": {**{name: s.get("rejected_by_reason", {}) for name, s in stats.items()},
                     "learner": learner_rejected},
        "dropped_frames": {name: s.get("dropped_frames", 0) for name, s in stats.items()},
        "skipped_steps": skipped, "crashed": sorted(name for name, s in stats.items() if "crashed" in s),
    }
    classes = len(poison_turns(vocab, context))
    say(f"poison: {outcome['poison_rows']} poisoned rows and results sent ({classes} classes x "
        f"{rounds} rounds through reward, poison-only episodes, 2 bad bodies x 2 receivers, a batch of every class "
        f"straight to the learner, {poison_results} league results)")
    say(f"poison: kept in the spill {in_spill}, in trained batches {in_batches}, in the league journal {in_journal}")
    say(f"poison: honest rows sent {honest_rows}, spilled {honest_spilled}; trained {outcome['trained_batches']} "
        f"batches of {outcome['trained_rows']} rows ({skipped} optimizer steps skipped as non-finite); league "
        f"resumed with {resumed} matches")
    if outcome["crashed"]:
        say(f"poison: CRASHED: {', '.join(outcome['crashed'])}")
    for name in ("reward", "replay", "learner", "league"):
        say(f"poison: {name} rejected {outcome['rejected'][name]}, dropped frames {outcome['dropped_frames'][name]}")
    return outcome
