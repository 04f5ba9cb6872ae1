"""Rank functions for the batched exchange tests (tests/comm/test_exchange.py): importable, JSON results, so
the processes and mpi backends run them too. As a script, one rank of an mpiexec launch:
``mpiexec -n 2 python tests/pp_comm_helpers.py [group|posted]`` prints rank 0's list of every rank's
results as JSON.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.comm import TrafficMeter, run_ranks  # noqa: E402
from engine.comm.exchange import exchange, post, progress  # noqa: E402
from engine.comm.group import Group  # noqa: E402

BIG = 4 << 20  # float64 elements: 32 MiB, far more than a socket or a shared-memory segment buffers


def payload(src: int, dst: int, i: int, n: int, dtype=np.float64) -> np.ndarray:
    """The i-th message from src to dst: known to both ends, different for every (src, dst, i)."""
    return (np.arange(n, dtype=np.float64) * (1 + src) + 1000.0 * dst + 7.0 * i).astype(dtype)


def swap(comm, emit) -> dict:
    """Every rank sends a large array to each other rank and receives each other's in one batch, plus three
    small messages to each peer that must arrive in order; one blocking send at a time would deadlock."""
    comm.meter = TrafficMeter(comm.rank)
    me, peers = comm.rank, [r for r in range(comm.world_size) if r != comm.rank]
    sends, recvs, want = [], [], []
    for peer in peers:
        sends.append((peer, payload(me, peer, 0, BIG)))
        sends += [(peer, payload(me, peer, i, 5 + i, np.float32)) for i in (1, 2, 3)]
        recvs.append((peer, np.empty(BIG)))
        recvs += [(peer, np.empty(5 + i, np.float32)) for i in (1, 2, 3)]
        want.append(payload(peer, me, 0, BIG))
        want += [payload(peer, me, i, 5 + i, np.float32) for i in (1, 2, 3)]
    phases = ["pp-activation" if a.size == BIG else "pp-gradient" for _, a in sends]
    exchange(comm, sends, recvs, phases)
    wrong = [i for i, ((_, got), w) in enumerate(zip(recvs, want)) if not np.array_equal(got, w)]
    sent = {f"{row['dst']}:{row['phase']}": row["bytes"] for row in comm.meter.snapshot()}
    return {"rank": me, "wrong": wrong, "sent": sent}


def posted_swap(comm, emit) -> dict:
    """`swap` as two non-blocking batches (exchange.post) posted before either is waited for: the 32 MiB
    messages, then three small ones to each peer, which queue behind them on each link. The second batch is
    waited for first, which must move the first (a wait moves every batch posted); the first then completes.
    Every rank posts both batches before it waits, so neither can complete one rank at a time."""
    comm.meter = TrafficMeter(comm.rank)
    me, peers = comm.rank, [r for r in range(comm.world_size) if r != comm.rank]
    big_recvs = [(peer, np.empty(BIG)) for peer in peers]
    small_recvs = [(peer, np.empty(5 + i, np.float32)) for peer in peers for i in (1, 2, 3)]
    first = post(comm, [(peer, payload(me, peer, 0, BIG)) for peer in peers], big_recvs,
                 ["pp-activation"] * len(peers))
    smalls = [(peer, payload(me, peer, i, 5 + i, np.float32)) for peer in peers for i in (1, 2, 3)]
    second = post(comm, smalls, small_recvs, ["pp-gradient"] * len(smalls))
    progress(comm)
    second.wait()
    complete_before_its_wait = first.done()
    first.wait()
    wrong = [peer for peer, got in big_recvs if not np.array_equal(got, payload(peer, me, 0, BIG))]
    wrong += [f"{peer}:{got.size}" for peer, got in small_recvs
              if not np.array_equal(got, payload(peer, me, got.size - 5, got.size, np.float32))]
    sent = {f"{row['dst']}:{row['phase']}": row["bytes"] for row in comm.meter.snapshot()}
    return {"rank": me, "wrong": wrong, "sent": sent, "first_done": complete_before_its_wait}


def one_call_at_a_time(comm, emit) -> None:
    """The same swap as blocking calls: each rank sends its 32 MiB, then receives. Both wait in their send
    for a receive the other never reaches (what `swap` shows exchange avoids)."""
    peer = 1 - comm.rank
    comm.send(peer, payload(comm.rank, peer, 0, BIG))
    comm.recv(peer, np.empty(BIG))


def in_group(comm, emit) -> dict:
    """A batch over a process group of the odd ranks, renumbered: group rank i is world rank 2i + 1. Group
    rank r sends to r + 1 and receives from r - 1 (a ring, all at once), so the translation must be right."""
    comm.meter = TrafficMeter(comm.rank)
    members = list(range(1, comm.world_size, 2))
    if comm.rank not in members:
        return {"rank": comm.rank, "ok": True, "links": []}
    group = Group(comm, members, "odd")
    r, n = group.rank, group.world_size
    got = np.empty(BIG // 8)
    exchange(group, [((r + 1) % n, payload(r, (r + 1) % n, 0, BIG // 8))], [((r - 1) % n, got)])
    links = [[row["src"], row["dst"], row["group"], row["phase"]] for row in comm.meter.snapshot()]
    return {"rank": comm.rank, "ok": bool(np.array_equal(got, payload((r - 1) % n, r, 0, BIG // 8))),
            "links": links}


if __name__ == "__main__":  # one rank of `mpiexec -n N python tests/pp_comm_helpers.py [group]`
    from mpi4py import MPI
    fn = {"group": in_group, "posted": posted_swap}.get(sys.argv[1] if sys.argv[1:] else "", swap)
    results = run_ranks(MPI.COMM_WORLD.Get_size(), "mpi", fn, timeout_s=120)
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(json.dumps(results))
