"""A learner group's rendezvous: its store listens on the run's address only, and a process that reaches it
without the group's secret cannot join: every member proves the secret with tensors before anything pickled is
sent (``actors.learner.group.proved_members``)."""

import multiprocessing
import queue

import psutil
import pytest

from actors.learner.group import open_rendezvous, parse_rendezvous


def _member(rank: int, rendezvous: str, results) -> None:
    """A process that joins a group of two at ``rendezvous`` as ``rank`` and says how it went."""
    import torch
    import torch.distributed as dist

    from actors.learner.group import Shard, join_group

    try:
        join_group(Shard(rank, 2), torch.device("cpu"), rendezvous)
        results.put((rank, "joined", ""))
    except Exception as error:  # noqa: BLE001 - what it was is the result
        results.put((rank, type(error).__name__, str(error)))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def joined(rendezvous_by_rank: dict[int, str]) -> dict[int, tuple[str, str]]:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    members = [context.Process(target=_member, args=(rank, rendezvous, results))
               for rank, rendezvous in rendezvous_by_rank.items()]
    for member in members:
        member.start()
    outcomes = {}
    try:
        for _ in members:
            rank, outcome, message = results.get(timeout=120)
            outcomes[rank] = (outcome, message)
    except queue.Empty:
        pass
    for member in members:
        member.join(10)
        if member.is_alive():
            member.kill()
    return outcomes


def test_the_store_listens_on_the_runs_address_only_and_its_secret_is_in_no_key():
    store, rendezvous = open_rendezvous("127.0.0.1", 2)
    secret, host, port = parse_rendezvous(rendezvous)
    assert host == "127.0.0.1" and len(secret) == 32
    listening = {c.laddr.ip for c in psutil.net_connections("tcp") if c.laddr and c.laddr.port == port
                 and c.status == psutil.CONN_LISTEN}
    assert listening == {"127.0.0.1"}  # torch's own server listens on 0.0.0.0
    assert joined({0: rendezvous, 1: rendezvous}) == {0: ("joined", ""), 1: ("joined", "")}
    assert store.list_keys() and not any(secret in key for key in store.list_keys())
    assert parse_rendezvous(open_rendezvous("127.0.0.1", 2)[1])[0] != secret  # fresh for each start
    for bad in ("127.0.0.1:5", "s@127.0.0.1", "@127.0.0.1:5"):
        with pytest.raises(ValueError, match="a learner group's rendezvous is '<secret>@<host>:<port>'"):
            parse_rendezvous(bad)


def test_a_stranger_who_reaches_the_store_without_the_secret_is_refused_by_the_run_rank():
    """It knows the port (anyone can find it) and takes rank 1's place: rank 0 refuses it before it sends a
    command, and the stranger learns nothing that would let it prove itself."""
    store, rendezvous = open_rendezvous("127.0.0.1", 2)
    _, host, port = parse_rendezvous(rendezvous)
    outcomes = joined({0: rendezvous, 1: f"{'0' * 32}@{host}:{port}"})
    assert outcomes[0][0] == "GroupIntruder" and "rank(s) [1] did not prove" in outcomes[0][1]
    assert outcomes[1][0] == "GroupIntruder" and "rank(s) [0] did not prove" in outcomes[1][1]
