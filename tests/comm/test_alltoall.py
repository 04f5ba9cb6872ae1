"""The all-to-all (engine.comm.alltoall) against a reference written from every rank's known sends: even and
uneven blocks, zero rows to some peers, a member that receives nothing, float32/float64/int64, groups of 1
to 4 members renumbered inside a larger world, both schedules; on threads, on processes and under mpiexec
(MPI's own Alltoallv too). The meter's bytes are exact per phase: the row counts (8 bytes to every peer)
under phase + "-sizes", the rows themselves under the phase, nothing for the block a member keeps."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import alltoall_helpers as helpers
import numpy as np
import pytest

from engine.comm import run_ranks
from engine.comm.alltoall import all_to_all, all_to_all_even
from engine.comm.threads import ThreadGroup

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPIEXEC = shutil.which("mpiexec")


def check(results: list[dict], group_size: int, algorithm: str) -> None:
    """Every member received the reference and booked exactly its payload and counts, to its peers only."""
    ranks = helpers.members(len(results), group_size)
    assert [r["rank"] for r in results if r["member"]] == sorted(ranks)
    for result in results:
        if not result["member"]:
            continue
        me, n = result["group_rank"], group_size
        assert result["wrong"] == []
        peers = [d for d in range(n) if d != me]
        for pattern in ("even", "uneven", "none-to-0"):
            for dtype in helpers.DTYPES:
                row_bytes = 6 * np.dtype(dtype).itemsize
                payload = sum(helpers.rows(pattern, me, d) for d in peers) * row_bytes
                want = {"dispatch": payload} if payload else {}
                if peers:
                    want["dispatch-sizes"] = 8 * len(peers)
                booked = result["booked"][f"{pattern}/{dtype}"]
                assert booked["bytes"] == want, (me, pattern, dtype)
                if algorithm == "mpi-native":  # opaque: what was handed to MPI, dst -1
                    assert booked["links"] == ([[-1, "world", algorithm]] if peers else [])
                else:  # the counts go to every peer in one round; rows only to the peers owed some
                    counts = {(d, "ep", "all-at-once") for d in peers}
                    rows = {(d, "ep", algorithm) for d in peers if helpers.rows(pattern, me, d)}
                    assert booked["links"] == [list(link) for link in sorted(counts | rows)]
        even = {"combine": 3 * 6 * 8 * len(peers)} if peers else {}
        if algorithm == "mpi-native" and peers:  # MPI's Alltoallv moves its counts in the even form too
            even["combine-sizes"] = 8 * len(peers)
        assert result["booked"]["even-form"]["bytes"] == even


@pytest.mark.parametrize("algorithm", ["pairwise", "all-at-once"])
@pytest.mark.parametrize("group_size", [1, 2, 3, 4])
def test_all_to_all_on_threads(group_size, algorithm):
    """The group is the world's last ranks reversed, in a world one larger: renumbered, rank 0 outside."""
    check(run_ranks(group_size + 1, "threads", helpers.run_cases, (group_size, algorithm), timeout_s=60),
          group_size, algorithm)


@pytest.mark.slow
@pytest.mark.parametrize("shm, algorithm", [("1", "all-at-once"), ("0", "pairwise")],
                         ids=["shared-memory", "socket"])
def test_all_to_all_on_processes(monkeypatch, shm, algorithm):
    """Both transports of the processes backend, one schedule each (each runs on threads above)."""
    monkeypatch.setenv("NANODIST_SHM", shm)
    check(run_ranks(4, "processes", helpers.run_cases, (3, algorithm), timeout_s=120), 3, algorithm)


@pytest.mark.slow
@pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not on PATH (pip install mpi4py mpich)")
@pytest.mark.parametrize("algorithm", ["pairwise", "mpi-native"])
def test_all_to_all_under_mpiexec(algorithm):
    """Four MPI ranks, the group the whole world (reversed for pairwise; MPI's own Alltoallv needs the world
    communicator itself, in order)."""
    pytest.importorskip("mpi4py")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(TESTS), TESTS])}
    command = [MPIEXEC, "-n", "4", sys.executable, os.path.join(TESTS, "alltoall_helpers.py"), algorithm]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    check(results, 4, algorithm)


def test_blocks_must_share_dtype_and_trailing_shape():
    comm = ThreadGroup(1, timeout_s=5).communicator(0)
    with pytest.raises(ValueError, match=r"sends\[1\] is float32\[2, 4\] but sends\[0\] is float32\[2, 3\]"):
        all_to_all(ThreadGroup(2, timeout_s=5).communicator(0), [np.zeros((2, 3), np.float32),
                                                                  np.zeros((2, 4), np.float32)])
    with pytest.raises(ValueError, match="one array per member of the group \\(1\\), got 2"):
        all_to_all(comm, [np.zeros(2), np.zeros(2)])
    with pytest.raises(ValueError, match=r"divides into 2 equal blocks, got shape \(3,\)"):
        all_to_all_even(ThreadGroup(2, timeout_s=5).communicator(0), np.zeros(3))
    with pytest.raises(ValueError, match="unknown all-to-all algorithm 'ring'"):
        all_to_all_even(comm, np.zeros(4), algorithm="ring")


def test_mpi_native_needs_the_mpi_world():
    comm = ThreadGroup(1, timeout_s=5).communicator(0)
    with pytest.raises(ValueError, match="'mpi-native' needs the mpi backend's world communicator"):
        all_to_all(comm, [np.zeros(2)], algorithm="mpi-native")
