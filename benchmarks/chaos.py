"""Chaos: kill one actor of every kind and crash one of every kind at random times during a real run; scale rollouts
1 -> 4 -> 2, envs 2 -> 3 -> 2.

    python benchmarks/chaos.py [--quick] [--seed 0] [--minutes 10] [--out runs/chaos] [overrides...]

The default job (self-play TicTacToe) on an embedded Ray cluster, with the env actors' ledgers on: each writes
the id of every training episode the reward actor acknowledged. Two faults hit each kind (reward, replay, learner,
an env actor, a rollout actor), in a random order at random times, each after the previous one is back (with
``learner.ranks=2`` the learner's victim is one of its ranks):

- a kill: SIGKILL of its process. The learner's is a learner restarted from an older checkpoint: it is killed
  between two checkpoints (at least 2 versions past the last), and its followers must take its lower versions (a
  new life): the benchmark waits until every rollout actor holds the new life's weights and every env actor
  counts admission against its version, and says from which version to which the learner went back;
- a crash: an exception raised inside the actor's running trio loop (``ActorHost.call(CRASH)``), which ends its
  process as a bug would, and the run restarts it as after a kill.

And what failed before on one node, once each (twice without ``--quick``): a *pair kill*, the learner (between two checkpoints) and the replay
killed together (an OOM, a full disk), whose restarted replay must take the episodes sampled by the dead learner's
later weights; a *hang*, one actor (reward, replay, an env or a rollout actor) stopped with SIGSTOP until the
driver's health check finds it hung (``run.ping_timeout_s`` x ``run.ping_misses``) and restarts it, then
resumed (SIGCONT, to a process already killed); and *drops*, a share of the episodes left unscored by the reward
actor (``reward.args.drop_every``), whose admission must come back, or the run would stall.

Meanwhile the run asks for 4 rollout actors, later 2, and for 3 env actors, later 2 (a leaving env actor first
delivers the episodes it started). At the end every episode is accounted for by id: produced (in a ledger),
consumed (in a batch the learner's final checkpoint had consumed), still held by replay, lost (produced and
nowhere) and duplicated (trained more than once); and the staleness of every trained token is checked against the
bound (``staleness_max``, of the live learner's versions). The time to recover from a fault is from the fault to
the first metrics row, once the actor is back and the learner past its version at the fault, whose episodes/s is
back to 75% of its mean over the last 10 rows before it. Ends with:

    kills=<n> crashes=<n> lost=<n> duplicated=<n> recover_s=<max seconds> scale_events=<n> staleness_max=<n>
    pair_kills=<n> hangs=<n> drops=<n> stalled_s=<seconds>

``stalled_s`` is the longest time no version advanced outside a fault's own recovery (from the fault to its
recovery, as above).

`--quick` (about four minutes): 3 minutes of training, small batches.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path

import ray

from actors.cli import load_config
from actors.runs.host import CRASH
from actors.models.checkpoints import checkpoint_cursor
from actors.runs.driver import Driver
from actors.replay.spill import account_episodes

KINDS = ["reward", "replay", "learner", "env", "rollout"]
FAULTS = ["kill", "crash"]
HUNG_KINDS = ["reward", "replay", "env", "rollout"]  # a hang's victim (a learner's update may hold it for long)
LIVENESS = ["run.ping_timeout_s=5", "run.ping_misses=2"]  # a hang is found within about 10 s of checks
DROP_EVERY = 25  # the reward actor leaves one episode in this many unscored
SCALES = [(0.2, "rollout", 4), (0.35, "env", 3), (0.55, "rollout", 2), (0.7, "env", 2)]  # (share of the budget, ...)
QUICK = ["replay.args.batch_episodes=16", "replay.args.capacity_episodes=32", "env.args.concurrency=16",
         "eval.endpoint_games_per_seat=4", "sampling.max_new_tokens=4", "learner.checkpoint_every=5"]
QUICK_MINUTES = 3.0


def schedule(rng: random.Random, budget_s: float, pairs: int = 1) -> list[tuple[float, str, object]]:
    """A kill and a crash of each kind, ``pairs`` pair kills and as many hangs at random times in the middle 5%-85%
    of the budget, in a random order, and the scale events; sorted by time."""
    faults = [(fault, kind) for kind in KINDS for fault in FAULTS]
    faults += [("pair", "learner")] * pairs + [("hang", kind) for kind in rng.sample(HUNG_KINDS, pairs)]
    faults = rng.sample(faults, len(faults))
    times = sorted(rng.uniform(0.05, 0.85) * budget_s for _ in faults)
    events = [(t, fault, kind) for t, (fault, kind) in zip(times, faults)]
    events += [(share * budget_s, "scale", (kind, count)) for share, kind, count in SCALES]
    return sorted(events, key=lambda e: e[0])


def wait_for(predicate, what: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"chaos: timed out waiting for {what}")
        time.sleep(0.05)


def victim(run: Driver, kind: str, rng: random.Random) -> str:
    top = run.top
    group = top.groups[run.cfg.run.policy_id]
    # a learner group (learner.ranks > 1): any of its ranks (the group restarts as a whole)
    learner = rng.choice(group.learner_group()) if group.learner_ranks else group.learner
    return {"reward": group.reward, "replay": group.replay, "learner": learner,
            "env": rng.choice(top.envs), "rollout": rng.choice(group.rollouts)}[kind]


def statistics(name: str) -> dict:
    return ray.get(ray.get_actor(name).statistics.remote())


def between_checkpoints(run: Driver) -> int:
    """Wait until the learner is at least 2 versions past its last checkpoint and 2 before its next (so that a kill
    now restarts it from an older checkpoint); its version."""
    every = run.cfg.learner.checkpoint_every
    learner = run.top.groups[run.cfg.run.policy_id].learner
    seen = {}

    def past_checkpoint() -> bool:
        seen["version"] = statistics(learner)["version"]
        return every < 4 or 2 <= seen["version"] % every <= every - 2

    wait_for(past_checkpoint, "the learner between two checkpoints")
    return seen["version"]


def followed_new_life(run: Driver, fault: dict, training) -> None:
    """After the learner's restart: until every rollout actor holds the new life's weights and every env actor
    counts admission against it; what they hold then goes in ``fault``. A run whose training ends first (its actors
    stop) leaves it unchecked, said in ``fault`` (``followed_s`` None)."""
    member = run.cfg.run.policy_id
    recovery = run.recoveries[member]
    wait_for(lambda: len(recovery.learner_starts) >= fault["learner_starts"] + 1, "the learner's restart")
    start = recovery.learner_starts[-1]
    group = run.top.groups[member]

    def followed() -> bool:
        if not training():
            return True
        try:
            rollouts = [statistics(r) for r in list(group.rollouts)]
            envs = [statistics(e) for e in list(run.top.envs)]
        except (ray.exceptions.RayError, ValueError):  # one restarting, or gone as the run stops: asked again
            return False
        fault["rollout_versions"] = [r["version"] for r in rollouts]
        return (all(r["learner_life"] == start["life"] and r["life"] in (start["life"], None) for r in rollouts)
                and all(e["learner_lives"].get(member) == start["life"] for e in envs))

    wait_for(followed, "the rollout and env actors to follow the learner's new life", timeout=120)
    if not training():
        fault.update(back_to=start["version"], life=start["life"], followed_s=None)
        print(f"  the learner went back to version {start['version']} (life {start['life']}); the run's training "
              "ended before its followers were checked", flush=True)
        return
    fault.update(back_to=start["version"], life=start["life"], followed_s=time.time() - fault["time"])
    print(f"  the learner went back from version {fault['version']} to {start['version']} (life {start['life']}); "
          f"rollout and env actors followed it after {fault['followed_s']:.1f} s (rollout versions "
          f"{fault['rollout_versions']})", flush=True)


def strike(name: str, fault: str, run: Driver) -> None:
    if fault == "kill":
        os.kill(ray.get(ray.get_actor(name).pid.remote()), signal.SIGKILL)
        return
    if fault == "pair":  # the learner and its replay at once, as one node's failure takes both
        replay = run.top.groups[run.cfg.run.policy_id].replay
        pids = [ray.get(ray.get_actor(actor).pid.remote()) for actor in (name, replay)]
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        return
    if fault == "hang":  # stopped until the health check restarts it; then resumed (it was killed meanwhile)
        pid = ray.get(ray.get_actor(name).pid.remote())
        restarts = run.metrics.restarts
        os.kill(pid, signal.SIGSTOP)
        try:
            wait_for(lambda: run.metrics.restarts > restarts, f"the hung {name} to be restarted")
        finally:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        return
    try:  # raised inside its trio loop: its process ends (maybe before this call's answer)
        ray.get(ray.get_actor(name).call.remote(CRASH, "a crash injected by benchmarks/chaos.py"))
    except ray.exceptions.RayActorError:
        pass


def drive(run: Driver, events, rng: random.Random, runner: threading.Thread) -> list[dict]:
    """Carry out ``events`` against the running ``run``; returns the faults (actor, kind of fault, time)."""
    wait_for(lambda: run.started is not None or not runner.is_alive(), "training to start")
    faults, restarts, scales = [], 0, 0
    budget_s = run.cfg.run.minutes * 60

    def training() -> bool:  # a scale or a fault is applied while the run trains only
        return time.time() - run.started < budget_s

    for at, what, arg in events:
        while time.time() < run.started + at and runner.is_alive():
            time.sleep(0.05)
        if not runner.is_alive():
            break
        # one thing at a time: the last restart and the last scale are done
        wait_for(lambda: run.metrics.restarts >= restarts, "the last restart")
        wait_for(lambda: (len(run.scaler.events) == scales and all("applied" in e for e in run.scaler.events))
                 or not training(), "the last scale")
        if what == "scale":
            if not training():
                print(f"the scale to {arg[1]} {arg[0]} actors comes after training: not asked for", flush=True)
                continue
            run.scale(*arg)
            scales += 1
            continue
        if not training():  # the run stops when its training ends: a fault struck then is never restarted
            print(f"the {what} of a {arg} actor comes after training (each restart before it took its time): "
                  "not struck", flush=True)
            continue
        name = victim(run, arg, rng)
        fault = {"actor": name, "fault": what, "kind": arg}
        older = what in ("kill", "pair") and arg == "learner"  # a learner restarted from an older checkpoint
        if older:
            fault.update(version=between_checkpoints(run),
                         learner_starts=len(run.recoveries[run.cfg.run.policy_id].learner_starts))
        if what == "pair" and name != run.top.groups[run.cfg.run.policy_id].learner:
            name = fault["actor"] = run.top.groups[run.cfg.run.policy_id].learner  # rank 0, beside its replay
        fault["time"] = time.time()
        strike(name, what, run)
        restarts += 2 if what == "pair" else 1
        fault["restarts"] = restarts
        faults.append(fault)
        done = {"kill": "killed", "crash": "crashed", "pair": "killed with its replay", "hang": "hung"}[what]
        print(f"{done} {name} at {fault['time'] - run.started:.1f} s", flush=True)
        if older:
            followed_new_life(run, fault, training)
    return faults


def recovery_s(rows: list[dict], killed_at: float, restarts: int) -> float | None:
    """Seconds from the fault to the first row, once the actor is back (the run's ``restarts``-th) and the learner
    beyond its version at the fault, at 75% of the mean episodes/s of the last 10 rows before it (None: never)."""
    before = [r for r in rows if r["time"] < killed_at and "episodes_per_s" in r][-10:]
    if not before:
        return None
    baseline = sum(r["episodes_per_s"] for r in before) / len(before)
    version = before[-1]["version"]
    after = (r for r in rows if r["time"] > killed_at and r["restarts"] >= restarts and r["version"] > version
             and r.get("episodes_per_s", 0) >= 0.75 * baseline)
    row = next(after, None)
    return None if row is None else row["time"] - killed_at


def stalled_s(rows: list[dict], faults: list[dict], recoveries: list[float | None]) -> float:
    """The longest time between two rows at which the learner's version advanced (the last stretch too) that
    overlaps no fault's own recovery (from the fault to its recovery, or to the end where it never recovered)."""
    windows = [(f["time"], f["time"] + (r if r is not None else float("inf"))) for f, r in zip(faults, recoveries)]
    rows = [r for r in rows if "version" in r and "time" in r]
    advanced = [r for i, r in enumerate(rows) if i == 0 or r["version"] > rows[i - 1]["version"]]
    ends = [(a["time"], b["time"]) for a, b in zip(advanced, advanced[1:])]
    if rows and advanced:
        ends.append((advanced[-1]["time"], rows[-1]["time"]))
    free = [end - start for start, end in ends if not any(s < end and start < e for s, e in windows)]
    return max(free, default=0.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--out", default="runs/chaos")
    args, overrides = parser.parse_known_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    minutes = QUICK_MINUTES if args.quick else args.minutes
    cfg = load_config([f"run.dir={args.out}", f"run.name=chaos-{int(time.time())}", "run.progress=false",
                       "run.ledger=true", "rollout.count=1", "env.count=2", f"run.minutes={minutes}",
                       "run.log_every_s=1", "eval.every_s=0", f"reward.args.drop_every={DROP_EVERY}", *LIVENESS,
                       *(QUICK if args.quick else []), *overrides])
    rng = random.Random(args.seed)
    events = schedule(rng, minutes * 60, pairs=1 if args.quick else 2)
    ray.init(num_cpus=cfg.ray.num_cpus, include_dashboard=False, logging_level=logging.WARNING)
    run = Driver(cfg)
    outcome = {}
    runner = threading.Thread(target=lambda: outcome.setdefault("summary", run.execute()))
    runner.start()
    try:
        faults = drive(run, events, rng, runner)
    finally:
        runner.join()
        ray.shutdown()
    summary = outcome["summary"]
    rows = [json.loads(line) for line in (run.dir / "metrics.jsonl").read_text().splitlines()]
    accounts = account_episodes(run.dir, summary["life"], checkpoint_cursor(run.dir / "policy", summary["life"]))
    recoveries = []
    for number, fault in enumerate(faults, 1):
        seconds = recovery_s(rows, fault["time"], fault["restarts"])
        recoveries.append(seconds)
        shown = "not within the run" if seconds is None else f"{seconds:.1f} s"
        print(f"{fault['actor']} ({fault['fault']}): back to 75% of its episodes/s in {shown}")
    staleness = [int(k) for k, n in summary["staleness_hist"].items() if n]
    staleness_max = max(staleness, default=0)
    print(f"episodes: {json.dumps(accounts)}")
    print(f"restarts: {summary['restarts']}  scale events: {[(e['kind'], e['from'], e['to']) for e in summary['scale_events']]}")
    print(f"policy version {summary['final_version']}, final non-loss {summary['final_nonloss']}")
    (Path(run.dir) / "chaos.json").write_text(json.dumps({"faults": faults, "recover_s": recoveries,
                                                          "accounts": accounts, "summary": summary}, indent=2))
    worst = max((r for r in recoveries if r is not None), default=float("nan"))
    if any(r is None for r in recoveries):
        worst = float("inf")
    count = {kind: sum(f["fault"] == kind for f in faults) for kind in ("kill", "crash", "pair", "hang")}
    drops = accounts.get("dropped", 0)  # given back to admission (the env actors' *.dropped ledgers)
    stalled = stalled_s(rows, faults, recoveries)
    print(f"trained tokens by staleness: {summary['staleness_hist']} (bound {cfg.learner.max_staleness})")
    print(f"kills={count['kill']} crashes={count['crash']} lost={accounts['lost']} duplicated={accounts['duplicated']} "
          f"recover_s={worst:.1f} scale_events={len(summary['scale_events'])} staleness_max={staleness_max} "
          f"pair_kills={count['pair']} hangs={count['hang']} drops={drops} stalled_s={stalled:.1f}")
    ok = accounts["lost"] == 0 and accounts["duplicated"] == 0 and staleness_max <= cfg.learner.max_staleness
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
