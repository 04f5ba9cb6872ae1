"""The conformance suite under ``mpiexec -n 2`` and ``-n 4`` (needs the ``mpi`` extra: mpi4py + mpich),
plus the "mpi-native" alternative all-reduce."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("mpi4py")
MPIEXEC = shutil.which("mpiexec")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not on PATH (pip install mpi4py mpich)")]
TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)


def mpirun(n: int, mode: str = "mpi") -> list:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, TESTS])}
    command = [MPIEXEC, "-n", str(n), sys.executable, os.path.join(TESTS, "comm_helpers.py"), mode]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("world_size", [2, 4])
def test_mpi_conformance(world_size):
    results = mpirun(world_size)
    assert [r["rank"] for r in results] == list(range(world_size))
    for result in results:
        assert result["failures"] == [], f"rank {result['rank']}"
        assert result["digests"] == results[0]["digests"]
        for t in result["traffic"]:
            if t["n"] % world_size == 0:
                assert t["total"] * world_size == 2 * (world_size - 1) * t["n"] * t["itemsize"]


def test_mpi_native_all_reduce_matches_ring():
    results = mpirun(2, "native")
    assert results == [{"rank": r, "failures": []} for r in range(2)]


def test_mpi_ranks_limit_their_blas_pools_to_their_share_of_the_host():
    results = mpirun(2, "pools")  # MPICH's Hydra states MPI_LOCALNRANKS=2 to each rank
    for r in results:
        others = [set(o["cores"]) for o in results if o["rank"] != r["rank"]]
        sharing = 1 + sum(bool(set(r["cores"]) & cores) for cores in others)
        expected = max(1, len(r["cores"]) // sharing)
        assert r["resolved"] == expected and r["blas"] == [expected], r
