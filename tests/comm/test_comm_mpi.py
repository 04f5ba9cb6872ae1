"""The conformance suite under ``mpiexec -n 2`` and ``-n 4`` (needs the ``mpi`` extra: mpi4py + mpich),
every all-reduce algorithm on every group of a 2 × 2 node grid, plus the "mpi-native" alternative
all-reduce."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import comm_helpers
import pytest
from extras import needs

needs("mpi4py", "mpi", "the MPI backend")
MPIEXEC = shutil.which("mpiexec")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not on PATH (pip install mpi4py mpich)")]
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # where comm_helpers.py lives
REPO = os.path.dirname(TESTS)


def mpirun(n: int, mode: str = "conformance", *args) -> list:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, TESTS])}
    command = [MPIEXEC, "-n", str(n), sys.executable, os.path.join(TESTS, "comm_helpers.py"), mode,
               *map(str, args)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env)
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


def test_mpi_algorithms_on_every_group():
    results = mpirun(4, "algorithms", 2)
    comm_helpers.assert_algorithms_exact(results, 2)
    comm_helpers.assert_bitwise_within_groups(results)
    comm_helpers.assert_algorithm_bytes(results, 2)


def test_mpi_ranks_limit_their_blas_pools_to_their_share_of_the_host():
    results = mpirun(2, "pools")  # MPICH's Hydra states MPI_LOCALNRANKS=2 to each rank
    for r in results:
        others = [set(o["cores"]) for o in results if o["rank"] != r["rank"]]
        sharing = 1 + sum(bool(set(r["cores"]) & cores) for cores in others)
        expected = max(1, len(r["cores"]) // sharing)
        # every BLAS pool: NumPy's, and MKL's where the mkl extra is installed
        assert r["resolved"] == expected and r["blas"] and r["blas"] == [expected] * len(r["blas"]), r
