"""One conformance suite for every backend (threads N = 1..8, processes N = 2 and 4; mpi in
test_comm_mpi.py): exact results, bitwise-identical ranks, and exactly the bytes a ring moves
(engine/comm/collectives.py: (N−1)/N·S per rank in reduce-scatter and again in all-gather when N
divides the size)."""

from __future__ import annotations

import functools
import json
import os
import secrets
import socket
import subprocess
import sys

import comm_helpers
import pytest

from engine.comm import TrafficMeter, algbw, busbw, run_ranks, shard_bounds

# processes-socket: the processes backend with the shared-memory fast path off (NANODIST_SHM=0);
# tcp: separately started processes meeting through MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE.
SPAWNED = [("processes", 2), ("processes", 4), ("processes-socket", 2), ("processes-socket", 3), ("tcp", 2)]
JOBS = [("threads", n) for n in range(1, 9)] + [pytest.param(*job, marks=pytest.mark.slow) for job in SPAWNED]
TESTS = os.path.dirname(os.path.abspath(__file__))


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


def tcp_job(world_size: int) -> tuple:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(world_size),
           "NANODIST_SECRET": secrets.token_hex(16),
           "PYTHONPATH": os.pathsep.join([os.path.dirname(TESTS), TESTS])}
    ranks = [subprocess.Popen([sys.executable, os.path.join(TESTS, "comm_helpers.py"), "tcp"],
                              env={**env, "RANK": str(r)}, stdout=subprocess.PIPE, text=True)
             for r in range(world_size)]
    outputs = [rank.communicate(timeout=60)[0] for rank in ranks]
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
    with meter.phase("reduce-scatter"):
        meter.record(meter.current_phase, 0, 1, 100, 0.5)
    meter.record(meter.current_phase, 0, 1, 7, 0.1)
    assert meter.snapshot() == [{"src": 0, "dst": 1, "phase": "p2p", "bytes": 7, "seconds": 0.1},
                                {"src": 0, "dst": 1, "phase": "reduce-scatter", "bytes": 100, "seconds": 0.5}]
    meter.begin_step(4)
    assert meter.snapshot() == [] and meter.bytes_sent() == 0
    assert sum(row["bytes"] for row in meter.totals()) == 107


def test_bandwidth_definitions():
    assert algbw(1000, 2.0) == 500
    assert busbw("all-reduce", 1000, 2.0, 4) == 500 * 2 * 3 / 4
    assert busbw("reduce-scatter", 1000, 2.0, 4) == busbw("all-gather", 1000, 2.0, 4) == 500 * 3 / 4
    assert busbw("broadcast", 1000, 2.0, 4) == 500
    with pytest.raises(ValueError):
        busbw("all-to-all", 1, 1.0, 2)


def test_shard_bounds_cover_exactly():
    for n in range(0, 30):
        for world_size in range(1, 9):
            bounds = [shard_bounds(n, world_size, r) for r in range(world_size)]
            assert bounds[0][0] == 0 and bounds[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(bounds[:-1], bounds[1:], strict=True))
            assert max(e - s for s, e in bounds) - min(e - s for s, e in bounds) <= 1
