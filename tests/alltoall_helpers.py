"""Rank functions for the all-to-all tests (tests/comm/test_alltoall.py): importable, JSON results, so the
processes and mpi backends run them too. As a script, one rank of an mpiexec launch:
``mpiexec -n 4 python tests/alltoall_helpers.py [algorithm]`` prints rank 0's list of every rank's results.

The reference is built from the pattern alone: what member s sends member d (``block``) is known to every
rank, so each rank's expected receives are written down directly, never computed by the code under test.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.comm import TrafficMeter, run_ranks  # noqa: E402
from engine.comm.alltoall import all_to_all, all_to_all_even  # noqa: E402
from engine.comm.group import Group  # noqa: E402

DTYPES = ("float32", "float64", "int64")
TRAILING = (2, 3)  # every block is rows × 2 × 3


def rows(pattern: str, src: int, dst: int) -> int:
    """How many rows member src sends member dst: even, uneven with zeros, or nothing at all to member 0."""
    if pattern == "even":
        return 3
    if pattern == "uneven":
        return (2 * src + 3 * dst) % 5  # 0 to some peers, up to 4 to others
    if pattern == "none-to-0":
        return 0 if dst == 0 else 1 + (src + dst) % 3
    raise ValueError(pattern)


def block(pattern: str, dtype: str, src: int, dst: int) -> np.ndarray:
    """The rows member src sends member dst: different for every (src, dst, row, column)."""
    n = rows(pattern, src, dst)
    values = np.arange(n * 6, dtype=np.float64).reshape(n, *TRAILING) + 1000 * src + 100 * dst + 0.25
    return values.astype(dtype)


def members(world_size: int, group_size: int) -> list[int]:
    """The group's world ranks: the last group_size ranks in reverse order (renumbered, and world rank 0 is
    outside it whenever the world is larger than the group)."""
    return list(reversed(range(world_size - group_size, world_size)))


def run_cases(comm, emit, group_size: int, algorithm: str = "pairwise") -> dict:
    """Every pattern and dtype on a group of group_size ranks: the receives against the reference, and the
    bytes the meter booked per phase, with the links' global ranks, group and algorithm."""
    comm.meter = TrafficMeter(comm.rank)
    ranks = members(comm.world_size, group_size)
    if comm.rank not in ranks:
        return {"rank": comm.rank, "member": False}
    # MPI's own Alltoallv runs on the MPI world communicator only: there the group is the world, in order
    group = comm if algorithm == "mpi-native" else Group(comm, ranks, "ep")
    me, n = group.rank, group.world_size
    wrong, booked = [], {}
    for pattern in ("even", "uneven", "none-to-0"):
        for dtype in DTYPES:
            case = f"{pattern}/{dtype}"
            comm.meter.begin_step(0)
            got = all_to_all(group, [block(pattern, dtype, me, d) for d in range(n)], "dispatch", algorithm)
            want = [block(pattern, dtype, s, me) for s in range(n)]
            if len(got) != n or any(g.dtype != w.dtype or g.shape != w.shape or not np.array_equal(g, w)
                                    for g, w in zip(got, want)):
                wrong.append(case)
            booked[case] = _booked(comm.meter, ranks)
        if pattern == "even":
            comm.meter.begin_step(0)
            got = all_to_all_even(group, np.concatenate([block(pattern, "float64", me, d) for d in range(n)]),
                                  "combine", algorithm)
            if not np.array_equal(got, np.concatenate([block(pattern, "float64", s, me) for s in range(n)])):
                wrong.append("even-form")
            booked["even-form"] = _booked(comm.meter, ranks)
    return {"rank": comm.rank, "member": True, "group_rank": me, "wrong": wrong, "booked": booked}


def _booked(meter: TrafficMeter, ranks: list[int]) -> dict:
    """Bytes per phase, and every link's (dst as a group rank, group, algorithm) seen."""
    by_phase: dict[str, int] = {}
    labels = set()
    for link in meter.snapshot():
        if link["bytes"]:
            by_phase[link["phase"]] = by_phase.get(link["phase"], 0) + link["bytes"]
        dst = ranks.index(link["dst"]) if link["dst"] in ranks else link["dst"]
        labels.add((dst, link["group"], link["algorithm"]))
    return {"bytes": by_phase, "links": [list(label) for label in sorted(labels)]}


if __name__ == "__main__":  # one rank of `mpiexec -n N python tests/alltoall_helpers.py [algorithm]`
    from mpi4py import MPI
    size = MPI.COMM_WORLD.Get_size()
    results = run_ranks(size, "mpi", run_cases, (size, *sys.argv[1:2]), timeout_s=120)
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(json.dumps(results))
