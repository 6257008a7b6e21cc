"""tidal's streams against the obvious alternatives, measured side by side in one run.

    python benchmarks/stream_bench.py [--quick] [--trajectories] [--doors] [--profile DIR]

1. Trajectory batches (records of 512 tokens: ids, log-probs, versions, scalars) from producer processes to
   a consumer process three ways: tidal streams (credits, frames, Arrow decode), Ray (an actor call per
   batch, through its object store), and raw ZeroMQ PUSH/PULL of the same bytes (no framing: the limit).
2. Publishing a 100 MB state dict to 1, 2 and 4 subscriber processes on this host.
3. The fuzzer (`tests/support/stream_fuzz.py`; `benchmarks/stream_fuzz.py` runs it alone): bad frames of every
   class at every kind of receiving endpoint of live actors, then a check that every actor still serves.

The last line is `vs_ray=<x> vs_raw=<x> publish4_vs_1=<x> fuzz_frames=<n> fuzz_crashes=<n>`
(`--trajectories`: the first two only).

`--doors` measures what closing the streams to other users of the host costs: tidal's trajectories over loopback
TCP (open to every local user), over Unix sockets in a private directory (what a run on one host binds) and over
loopback TCP with CURVE keys (encrypted, authenticated), taking turns; its last line is
`ipc_vs_tcp=<x> curve_vs_tcp=<x>`.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import multiprocessing as mp
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

import trio
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: its packages and tests.support

from streams.endpoints import Inbox, Outbox  # noqa: E402
from streams.channels import ZmqTransport  # noqa: E402
from streams.private_files import SOCKET_ROOT, private_dir, remove_private_dir  # noqa: E402
from streams.security import CurveKeys  # noqa: E402
from streams.schema import decode_table, encode_table  # noqa: E402
from streams.wire import Kind  # noqa: E402
from tests.support.trajectories import TOKENS, trajectory_batch  # noqa: E402

# -- 1. trajectories: three ways ----------------------------------------------------------------------

def bench_transport(way: str = "tcp", where: str | None = None) -> ZmqTransport:
    """``tcp``: loopback TCP; ``ipc``: Unix sockets in the private directory ``where``; ``curve``: loopback TCP
    with the CURVE keys in ``where``."""
    if way == "ipc":
        return ZmqTransport(ipc_dir=where)
    if way == "curve":
        return ZmqTransport(curve=CurveKeys.load(where))
    return ZmqTransport()


def tidal_consumer(results, total: int, way: str = "tcp", where: str | None = None) -> None:
    transport = bench_transport(way, where)

    async def main():
        async with transport.open_receiver(capacity=64) as receiver:
            results.put(receiver.address)
            inbox = Inbox(receiver, Kind.BATCH, decode_table)
            rows = (await inbox.receive()).num_rows
            started = time.perf_counter()
            for _ in range(total - 1):
                rows += (await inbox.receive()).num_rows
            results.put((rows, time.perf_counter() - started))

    trio.run(main)
    transport.close()
    zmq.Context.instance().term()  # the receiver's last acknowledgements go out: its producers are draining


def tidal_producer(address: str, index: int, batches: int, records: int, way: str = "tcp",
                   where: str | None = None) -> None:
    body = encode_table(trajectory_batch(records, index))

    async def main():
        async with bench_transport(way, where).open_sender([address], capacity=64) as sender:
            outbox = Outbox(sender, Kind.BATCH, f"producer-{index}")
            for _ in range(batches):
                await outbox.send(body)
            await sender.drain()  # every batch acknowledged: this process may exit

    trio.run(main)


def raw_consumer(results, total: int) -> None:
    socket = zmq.Context.instance().socket(zmq.PULL)
    port = socket.bind_to_random_port("tcp://127.0.0.1")
    results.put(f"tcp://127.0.0.1:{port}")
    socket.recv(copy=False)
    started = time.perf_counter()
    for _ in range(total - 1):
        socket.recv(copy=False)
    results.put((None, time.perf_counter() - started))


def raw_producer(address: str, index: int, batches: int, records: int) -> None:
    body = encode_table(trajectory_batch(records, index))
    socket = zmq.Context.instance().socket(zmq.PUSH)
    socket.connect(address)
    for _ in range(batches):
        socket.send(body, copy=False)
    socket.close(linger=-1)
    zmq.Context.instance().term()  # waits until every batch is sent: a child process exits without flushing


def run_processes(consumer, producer, producers: int, batches: int, records: int) -> float:
    """Records per second from ``producers`` processes to one consumer process."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    total = producers * batches
    receiving = ctx.Process(target=consumer, args=(results, total))
    receiving.start()
    address = results.get(timeout=60)
    sending = [ctx.Process(target=producer, args=(address, i, batches, records)) for i in range(producers)]
    for process in sending:
        process.start()
    try:
        _, seconds = results.get(timeout=300)
    except Exception:
        states = [(p.name, p.is_alive(), p.exitcode) for p in [receiving, *sending]]
        raise RuntimeError(f"{_name(consumer)}: no result in 300 s; processes (name, alive, exit code): {states}")
    for process in [receiving, *sending]:
        process.join(60)
        if process.is_alive():  # a producer still draining: its last acknowledgements never came
            process.kill()
            raise RuntimeError(f"{_name(producer)}: {process.name} had not ended 60 s after the last batch")
    return (total - 1) * records / seconds


def _name(function) -> str:
    """A function's name, or a partial's with its arguments (a way of `bench_doors`, a profiled one)."""
    return repr(function) if isinstance(function, functools.partial) else function.__name__


def _profiled(target, path: str, *args) -> None:
    """``target(*args)`` under cProfile, its statistics to ``path`` (``{pid}`` there: this process's id)."""
    profile = cProfile.Profile()
    profile.enable()
    try:
        target(*args)
    finally:
        profile.disable()
        profile.dump_stats(path.format(pid=os.getpid()))


def profile_trajectories(directory: str, batches: int = 2000, records: int = 64, producers: int = 2) -> None:
    """Run tidal's and raw ZeroMQ's trajectory processes once each under cProfile: every process writes
    ``<directory>/<way>-<consumer|producer>-<pid>.prof`` (for pstats or snakeviz); the top of the consumer's and
    of one producer's is printed."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    for way, consumer, producer in (("tidal", tidal_consumer, tidal_producer), ("raw", raw_consumer, raw_producer)):
        for old in Path(directory).glob(f"{way}-*.prof"):
            old.unlink()
        path = str(Path(directory) / f"{way}-{{end}}-{{{{pid}}}}.prof")
        rate = run_processes(functools.partial(_profiled, consumer, path.format(end="consumer")),
                             functools.partial(_profiled, producer, path.format(end="producer")),
                             producers, batches, records)
        print(f"{way}: {rate:.0f} records/s under the profiler", flush=True)
        for end in ("consumer", "producer"):
            shown = sorted(Path(directory).glob(f"{way}-{end}-*.prof"))[0]
            print(f"--- {way} {end}: {shown}")
            pstats.Stats(str(shown)).sort_stats("tottime").print_stats(12)


def run_ray(producers: int, batches: int, records: int, window: int = 8) -> float:
    import ray

    @ray.remote(num_cpus=0)
    class Consumer:
        def __init__(self):
            self.rows, self.first, self.last = 0, None, None

        def consume(self, table) -> None:
            self.last = time.perf_counter()
            self.first = self.first or self.last
            self.rows += table.num_rows

        def result(self):
            return self.rows, self.last - self.first

    @ray.remote(num_cpus=0)
    def produce(consumer, index: int) -> None:
        table, pending = trajectory_batch(records, index), []
        for _ in range(batches):
            pending.append(consumer.consume.remote(table))
            if len(pending) >= window:
                _, pending = ray.wait(pending, num_returns=1)
        ray.get(pending)

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    try:
        consumer = Consumer.remote()
        ray.get([produce.remote(consumer, i) for i in range(producers)])
        rows, seconds = ray.get(consumer.result.remote())
    finally:
        ray.shutdown()
    return (rows - records) / seconds


def bench_trajectories(quick: bool, records: int = 64, producers: int = 2) -> dict:
    """Records per second each way. tidal and raw take turns (median of their runs), so that a change in
    the machine's load falls on both alike; Ray, an order of magnitude slower, runs once."""
    batches, repeats = (200, 3) if quick else (1000, 5)
    runs = {"tidal": [], "raw": []}
    for _ in range(repeats):
        runs["tidal"].append(run_processes(tidal_consumer, tidal_producer, producers, batches, records))
        runs["raw"].append(run_processes(raw_consumer, raw_producer, producers, batches, records))
    rates = {name: statistics.median(rates) for name, rates in runs.items()}
    rates["ray"] = run_ray(producers, batches // 2, records)
    batch_kb = len(encode_table(trajectory_batch(records))) / 1024
    for name, rate in rates.items():
        spread = f", runs {min(runs[name]):.0f}-{max(runs[name]):.0f}" if name in runs else ""
        print(f"trajectories {name:>5}: {rate:10.0f} records/s  ({rate * TOKENS / 1e6:.1f} M tokens/s; {producers} "
              f"producers, batches of {records} records = {batch_kb:.0f} KiB{spread})", flush=True)
    return rates


def bench_doors(quick: bool, records: int = 64, producers: int = 2) -> dict:
    """tidal's trajectories, records per second, over loopback TCP, Unix sockets in a private directory, and loopback
    TCP with CURVE: they take turns (median of their runs), so that a change in the machine's load falls on all."""
    batches, repeats = (200, 3) if quick else (1000, 5)
    sockets, keys = private_dir(SOCKET_ROOT, "bench"), private_dir(SOCKET_ROOT, "bench-keys")
    CurveKeys.create(str(keys))
    ways = {"tcp": None, "ipc": str(sockets), "curve": str(keys)}
    runs = {way: [] for way in ways}
    try:
        for repeat in range(repeats):
            order = list(ways)[repeat % len(ways):] + list(ways)[:repeat % len(ways)]
            for way in order:
                runs[way].append(run_processes(functools.partial(tidal_consumer, way=way, where=ways[way]),
                                               functools.partial(tidal_producer, way=way, where=ways[way]),
                                               producers, batches, records))
    finally:
        remove_private_dir(sockets)
        remove_private_dir(keys)
    rates = {way: statistics.median(rates) for way, rates in runs.items()}
    for way, rate in rates.items():
        print(f"trajectories over {way:>5}: {rate:10.0f} records/s  ({rate * TOKENS / 1e6:.1f} M tokens/s; {producers} "
              f"producers, runs {min(runs[way]):.0f}-{max(runs[way]):.0f})", flush=True)
    return rates


# -- 2. weights: one publish, many readers ------------------------------------------------------------

GROUPS = (1, 2, 4)  # a publish goes to the first n subscribers: each subscribes to the groups it is in


def group_topic(n: int) -> bytes:
    from streams.messages import WEIGHTS_TOPIC

    return WEIGHTS_TOPIC + b"group%d" % n


def weights_subscriber(address: str, report: str, index: int) -> None:
    """Follows the weights like a rollout actor: fetch, check, copy into the model's tensors, report."""
    import torch

    from streams.weights import WeightsFollower, tensors_from_buffer
    from streams.messages import WeightsManifest

    torch.set_num_threads(1)  # as a rollout actor does (rollout.threads): one core each

    async def main():
        transport = ZmqTransport()
        out = zmq.Context.instance().socket(zmq.PUSH)
        out.connect(report)
        follower, have, model = WeightsFollower(transport), -1, state_dict_100mb(torch.empty)
        topics = [group_topic(n) for n in GROUPS if index < n]
        async with transport.open_subscriber([address], topics) as subscription:
            inbox = Inbox(subscription, Kind.WEIGHTS, WeightsManifest.from_body, topic=True)
            while True:
                manifest = await inbox.receive()
                if manifest.version <= have:
                    continue
                data = await follower.fetch(manifest)
                await trio.to_thread.run_sync(_copy_into, model, tensors_from_buffer(data))
                have = manifest.version
                out.send_string(f"{index} {have} {time.time()!r}")

    trio.run(main)


def _copy_into(model: dict, tensors: dict) -> None:
    for name, tensor in tensors.items():
        model[name].copy_(tensor)


def state_dict_100mb(make=None):
    import torch

    return {f"layer{i}.weight": (make or torch.randn)(1024, 1024) for i in range(25)}  # 25 x 4 MiB


async def publish_rounds(rounds: int) -> dict[int, float]:
    """Median seconds from starting a publish (serialization included) until each of its n subscribers has
    it checked and copied into its model, for n in GROUPS; the group sizes take turns, round by round, so
    that a change in the machine's load falls on all of them alike."""
    from safetensors.torch import save as save_tensors

    from streams.weights import WeightsPublisher
    from streams.messages import WeightsFetch

    transport, ctx = ZmqTransport(), mp.get_context("spawn")
    reports = zmq.Context.instance().socket(zmq.PULL)
    report_address = f"tcp://127.0.0.1:{reports.bind_to_random_port('tcp://127.0.0.1')}"
    state, times = state_dict_100mb(), {n: [] for n in GROUPS}
    async with transport.open_publisher(capacity=16) as publisher, transport.open_receiver() as fetches:
        groups = {n: WeightsPublisher(f"bench{n}", "main", Outbox(publisher, Kind.WEIGHTS, "bench", topic=group_topic(n)),
                                      fetches.address) for n in GROUPS}
        processes = [ctx.Process(target=weights_subscriber, args=(publisher.address, report_address, i), daemon=True)
                     for i in range(max(GROUPS))]
        for process in processes:
            process.start()
        try:
            async with trio.open_nursery() as nursery:
                fetch_inbox = Inbox(fetches, Kind.WEIGHTS_FETCH, WeightsFetch.from_body)
                nursery.start_soon(groups[max(GROUPS)].serve_chunks, fetch_inbox, transport)
                version = 0  # the warm-up: every subscriber joins and takes one version
                await groups[max(GROUPS)].publish(version, await trio.to_thread.run_sync(save_tensors, state))
                await _reports(reports, groups[max(GROUPS)], version, max(GROUPS), announce=True)
                for round_ in range(rounds):
                    for n in GROUPS[round_ % len(GROUPS):] + GROUPS[:round_ % len(GROUPS)]:
                        version += 1
                        started = time.time()
                        await groups[n].publish(version, await trio.to_thread.run_sync(save_tensors, state))
                        times[n].append(max(await _reports(reports, groups[n], version, n)) - started)
                nursery.cancel_scope.cancel()
        finally:
            for weights in groups.values():
                weights.close()
            for process in processes:
                process.kill()
    reports.close(0)
    return {n: statistics.median(t) for n, t in times.items()}


async def _reports(reports, weights, version: int, subscribers: int, announce: bool = False) -> list[float]:
    done: dict[int, float] = {}
    while len(done) < subscribers:
        try:
            index, got, at = reports.recv_string(zmq.NOBLOCK).split()
        except zmq.Again:
            if announce:
                await weights.announce_latest()  # subscribers still joining (as the learner does every second)
            await trio.sleep(0.002)
            continue
        if int(got) == version:
            done[int(index)] = float(at)
    return list(done.values())


def bench_weights(quick: bool) -> dict:
    rounds = 5 if quick else 15
    seconds = trio.run(publish_rounds, rounds)
    for n, s in seconds.items():
        print(f"weights publish, 100 MB to {n} subscriber(s): {s * 1000:7.0f} ms (median of {rounds}, interleaved)",
              flush=True)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description="tidal's streams against Ray and raw ZeroMQ, weights, a fuzzer")
    parser.add_argument("--quick", action="store_true", help="a shorter run (about a minute)")
    parser.add_argument("--profile", metavar="DIR", help="only profile the trajectory processes (cProfile, into DIR)")
    parser.add_argument("--trajectories", action="store_true", help="only the trajectories, tidal against raw and Ray")
    parser.add_argument("--doors", action="store_true",
                        help="only tidal's trajectories over loopback TCP, Unix sockets and CURVE, side by side")
    args = parser.parse_args()
    if args.profile:
        return profile_trajectories(args.profile)
    if args.doors:
        rates = bench_doors(args.quick)
        return print(f"ipc_vs_tcp={rates['ipc'] / rates['tcp']:.2f} curve_vs_tcp={rates['curve'] / rates['tcp']:.2f}")
    if args.trajectories:
        rates = bench_trajectories(args.quick)
        return print(f"vs_ray={rates['tidal'] / rates['ray']:.2f} vs_raw={rates['tidal'] / rates['raw']:.2f}")
    from tests.support.stream_fuzz import fuzz_live_actors, summary  # here: it imports every actor (no producer needs)

    rates = bench_trajectories(args.quick)
    seconds = bench_weights(args.quick)
    fuzz = fuzz_live_actors(1000 if args.quick else 10_000)
    print(f"vs_ray={rates['tidal'] / rates['ray']:.2f} vs_raw={rates['tidal'] / rates['raw']:.2f} "
          f"publish4_vs_1={seconds[4] / seconds[1]:.2f} {summary(fuzz)}")


if __name__ == "__main__":
    main()
