"""One conformance suite for every backend (threads N = 1..8, processes N = 2 and 4, tcp; mpi in
test_comm_mpi.py): exact results, bitwise-identical ranks, and exactly the bytes a ring moves
(engine/comm/ring.py: (N−1)/N·S per rank in reduce-scatter and again in all-gather when N
divides the size); then every all-reduce algorithm (ring, rhd, tree, hierarchical, auto) on every
group a rank belongs to (world, node, cross-node column, a renumbered subset), against a float64
reference and each algorithm's byte formula."""

from __future__ import annotations

import functools
import json
import os
import secrets
import socket
import subprocess
import sys

import comm_helpers
import numpy as np
import pytest

from engine.comm import TrafficMeter, algbw, busbw, run_ranks, shard_bounds
from engine.comm.group import Group, NodeGrid

# processes-socket: the processes backend with the shared-memory fast path off (NANODIST_SHM=0);
# tcp: separately started processes meeting through MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE.
SPAWNED = [("processes", 2), ("processes", 4), ("processes-socket", 2), ("processes-socket", 3), ("tcp", 2)]
JOBS = [("threads", n) for n in range(1, 9)] + [pytest.param(*job, marks=pytest.mark.slow) for job in SPAWNED]
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # where comm_helpers.py lives


@functools.cache
def job(backend: str, world_size: int) -> tuple:
    if backend == "tcp":
        return tcp_job(world_size)
    if backend == "processes-socket":
        os.environ["NANODIST_SHM"] = "0"
        try:
            return tuple(run_ranks(world_size, "processes", comm_helpers.conformance))
        finally:
            del os.environ["NANODIST_SHM"]
    return tuple(run_ranks(world_size, backend, comm_helpers.conformance))


def tcp_job(world_size: int, *args) -> tuple:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(world_size),
           "NANODIST_SECRET": secrets.token_hex(16),
           "PYTHONPATH": os.pathsep.join([os.path.dirname(TESTS), TESTS])}
    command = [sys.executable, os.path.join(TESTS, "comm_helpers.py"), "tcp", *map(str, args)]
    ranks = [subprocess.Popen(command,
                              env={**env, "RANK": str(r)}, stdout=subprocess.PIPE, text=True)
             for r in range(world_size)]
    outputs = [rank.communicate(timeout=180)[0] for rank in ranks]
    assert all(rank.returncode == 0 for rank in ranks)
    return tuple(json.loads(out.strip().splitlines()[-1]) for out in outputs)


@pytest.mark.parametrize("backend,world_size", JOBS)
def test_results_exact(backend, world_size):
    results = job(backend, world_size)
    assert [r["rank"] for r in results] == list(range(world_size))
    for result in results:
        assert result["failures"] == [], f"rank {result['rank']}"


@pytest.mark.parametrize("backend,world_size", JOBS)
def test_ranks_bitwise_identical(backend, world_size):
    results = job(backend, world_size)
    for result in results[1:]:
        assert result["digests"] == results[0]["digests"]


@pytest.mark.parametrize("backend,world_size", JOBS)
def test_all_reduce_bytes_exact(backend, world_size):
    """2(N−1)/N·S per rank when N divides n; otherwise S − |shard r| + S − |shard r+1| (no padding)."""
    checked_divisible = 0
    for rank, result in enumerate(job(backend, world_size)):
        for t in result["traffic"]:
            n, item, size = t["n"], t["itemsize"], t["n"] * t["itemsize"]
            start, end = shard_bounds(n, world_size, rank)
            after_start, after_end = shard_bounds(n, world_size, (rank + 1) % world_size)
            assert t["rs"] == (n - (end - start)) * item  # every shard but its own
            assert t["ag"] == (n - (after_end - after_start)) * item  # every shard but the next rank's
            assert t["total"] == t["rs"] + t["ag"]
            if n % world_size == 0:
                assert t["total"] * world_size == 2 * (world_size - 1) * size
                checked_divisible += 1
    assert checked_divisible > 0


def test_meter_snapshot_and_phases():
    meter = TrafficMeter(rank=0)
    meter.begin_step(3)
    with meter.phase("reduce-scatter"), meter.algorithm("ring"):
        meter.record(meter.current_phase, 0, 1, 100, 0.5)
    meter.record(meter.current_phase, 0, 1, 7, 0.1)
    with meter.phase("param-gather"), meter.phase("all-gather"), meter.algorithm("hierarchical"), \
            meter.algorithm("ring"):  # labels nest: the outermost wins
        meter.record(meter.current_phase, 0, 2, 5, 0.2, group="node0")
    assert meter.snapshot() == [
        {"src": 0, "dst": 1, "phase": "p2p", "group": "world", "algorithm": "p2p", "bytes": 7,
         "seconds": 0.1},
        {"src": 0, "dst": 1, "phase": "reduce-scatter", "group": "world", "algorithm": "ring", "bytes": 100,
         "seconds": 0.5},
        {"src": 0, "dst": 2, "phase": "param-gather", "group": "node0", "algorithm": "hierarchical",
         "bytes": 5, "seconds": 0.2}]
    assert meter.bytes_sent(group="node0") == 5 and meter.bytes_sent("p2p") == 7
    meter.begin_step(4)
    assert meter.snapshot() == [] and meter.bytes_sent() == 0
    assert sum(row["bytes"] for row in meter.totals()) == 112


def _group_traffic(comm, emit):
    """Point-to-point on a group: translated ranks, the group's name and global ranks on the meter."""
    comm.meter = TrafficMeter(comm.rank)
    group = Group(comm, [3, 1], "pair")  # group rank 0 is world rank 3
    got = np.zeros(4, np.int64)
    if group.rank == 0:
        group.send(1, np.full(4, 30, np.int64))
        group.recv(1, got)
    else:
        group.recv(0, got)
        group.send(0, np.full(4, 10, np.int64))
    return {"rank": comm.rank, "group_rank": group.rank, "size": group.world_size, "got": got.tolist(),
            "global": [group.global_rank(r) for r in range(2)], "links": comm.meter.snapshot()}


def test_a_group_is_a_view_over_its_parent():
    results = [r for r in run_ranks(4, "threads", _group_in_world) if r is not None]
    assert [(r["rank"], r["group_rank"], r["size"]) for r in results] == [(1, 1, 2), (3, 0, 2)]
    assert results[0]["got"] == [30] * 4 and results[1]["got"] == [10] * 4
    assert all(r["global"] == [3, 1] for r in results)
    links = [(link["src"], link["dst"], link["group"], link["bytes"]) for r in results for link in r["links"]]
    assert links == [(1, 3, "pair", 32), (3, 1, "pair", 32)]


def _group_in_world(comm, emit):
    return _group_traffic(comm, emit) if comm.rank in (1, 3) else None


def test_groups_refuse_ranks_they_cannot_hold():
    class World:  # just what Group reads of its parent
        rank, world_size, timeout_s, meter, signals = 0, 4, 1.0, None, None
    with pytest.raises(ValueError, match="not one of its ranks"):
        Group(World(), [1, 2], "g")
    with pytest.raises(ValueError, match="distinct ranks"):
        Group(World(), [0, 0, 1], "g")
    with pytest.raises(ValueError, match="distinct ranks"):
        Group(World(), [0, 4], "g")


def test_node_grid_rows_and_columns():
    class World:
        world_size, timeout_s, meter, signals = 6, 1.0, None, None

        def __init__(self, rank):
            self.rank = rank

        def global_rank(self, r):
            return r
    grid = NodeGrid(World(4), 3)
    assert (grid.nodes, grid.ranks_per_node, grid.node, grid.local) == (2, 3, 1, 1)
    assert (grid.intra.name, grid.intra.ranks, grid.intra.rank) == ("node1", [3, 4, 5], 1)
    assert (grid.inter.name, grid.inter.ranks, grid.inter.rank) == ("cross1", [1, 4], 1)
    assert grid.two_level and not NodeGrid(World(4), 0).two_level and not NodeGrid(World(4), 1).two_level
    with pytest.raises(ValueError, match="does not divide"):
        NodeGrid(World(4), 4)


def test_bandwidth_definitions():
    assert algbw(1000, 2.0) == 500
    assert busbw("all-reduce", 1000, 2.0, 4) == 500 * 2 * 3 / 4
    assert busbw("reduce-scatter", 1000, 2.0, 4) == busbw("all-gather", 1000, 2.0, 4) == 500 * 3 / 4
    assert busbw("broadcast", 1000, 2.0, 4) == 500
    assert busbw("all-to-all", 1000, 2.0, 4) == 500 * 3 / 4  # NCCL-tests: (N-1)/N of S crosses a link
    with pytest.raises(ValueError, match="unknown collective 'scatter'"):
        busbw("scatter", 1, 1.0, 2)


def test_shard_bounds_cover_exactly():
    for n in range(0, 30):
        for world_size in range(1, 9):
            bounds = [shard_bounds(n, world_size, r) for r in range(world_size)]
            assert bounds[0][0] == 0 and bounds[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(bounds[:-1], bounds[1:], strict=True))
            assert max(e - s for s, e in bounds) - min(e - s for s, e in bounds) <= 1


# ---------------------------------------------------------------------------------------- algorithms × groups
# Every all-reduce algorithm on every view a rank belongs to: the world, its node and its cross-node
# column of a node grid (ranks_per_node = G), and a strict subset with renumbered ranks. The bytes are
# held to each algorithm's own formula, written out here from its definition.

ALGO_GRIDS = [(1, 0), (2, 1), (3, 0), (4, 2), (6, 3), (6, 2), (7, 0), (8, 4)]  # groups of 1..8 ranks
ALGO_SPAWNED = [("processes", 4, 2), ("processes-socket", 3, 0), ("tcp", 4, 2)]
ALGO_JOBS = [("threads", n, g) for n, g in ALGO_GRIDS] + [pytest.param(*j, marks=pytest.mark.slow)
                                                          for j in ALGO_SPAWNED]


@functools.cache
def algo_job(backend: str, world_size: int, ranks_per_node: int) -> tuple:
    if backend == "tcp":
        return tcp_job(world_size, "algorithms", ranks_per_node)
    if backend == "processes-socket":
        os.environ["NANODIST_SHM"] = "0"
        try:
            return tuple(run_ranks(world_size, "processes", comm_helpers.algorithm_conformance,
                                   (ranks_per_node,), timeout_s=120))
        finally:
            del os.environ["NANODIST_SHM"]
    return tuple(run_ranks(world_size, backend, comm_helpers.algorithm_conformance, (ranks_per_node,),
                           timeout_s=120))


@pytest.mark.parametrize("backend,world_size,ranks_per_node", ALGO_JOBS)
def test_algorithms_exact_on_every_group(backend, world_size, ranks_per_node):
    comm_helpers.assert_algorithms_exact(algo_job(backend, world_size, ranks_per_node), ranks_per_node)


@pytest.mark.parametrize("backend,world_size,ranks_per_node", ALGO_JOBS)
def test_algorithms_bitwise_identical_within_each_group(backend, world_size, ranks_per_node):
    comm_helpers.assert_bitwise_within_groups(algo_job(backend, world_size, ranks_per_node))


@pytest.mark.parametrize("backend,world_size,ranks_per_node", ALGO_JOBS)
def test_algorithm_bytes_match_their_formulas(backend, world_size, ranks_per_node):
    comm_helpers.assert_algorithm_bytes(algo_job(backend, world_size, ranks_per_node), ranks_per_node)
