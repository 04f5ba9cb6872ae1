"""Threads per rank (engine/comm/cores.py): each rule with fake environments and CPU reports, and the
pools as threadpoolctl reports them from inside real ranks."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from threadpoolctl import threadpool_info

from engine.comm import cores
from engine.comm.launch import run_ranks
from engine.config import ConfigError, from_dict
from engine.fast import thread_pool
from engine.run.job import run_training
from tests import comm_helpers
from tests.parallel_helpers import tiny_gpt

HOST_CORES = len(os.sched_getaffinity(0))


def blas_pools() -> list[int]:
    return [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]


def test_auto_is_the_cores_divided_by_the_ranks_sharing_them_and_never_zero():
    assert cores.resolve(0, 16, 4) == 4
    assert cores.resolve(0, 16, 3) == 5  # whole threads, rounded down: never more threads than cores
    assert cores.resolve(0, 2, 8) == 1   # more ranks than cores: one thread each
    assert cores.resolve(3, 16, 4) == 3  # a configured figure wins
    with pytest.raises(ValueError):
        cores.resolve(-1, 16, 4)


@pytest.mark.parametrize("environ, expected", [
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "4", "MPI_LOCALNRANKS": "2"}, 4),     # Open MPI first
    ({"MPI_LOCALNRANKS": "2", "PMI_SIZE": "8"}, 2),                       # MPICH's Hydra
    ({"MV2_COMM_WORLD_LOCAL_SIZE": "3"}, 3),                               # MVAPICH2
    ({"SLURM_STEP_TASKS_PER_NODE": "4(x2),3", "SLURM_NODEID": "0"}, 4),   # srun's compressed list
    ({"SLURM_STEP_TASKS_PER_NODE": "4(x2),3", "SLURM_NODEID": "2"}, 3),
    ({"SLURM_STEP_TASKS_PER_NODE": "garbled", "SLURM_NODEID": "0", "SLURM_NTASKS_PER_NODE": "6"}, 6),
    ({"SLURM_NTASKS_PER_NODE": "6"}, 6),
    ({"PMI_RANK": "0", "PMI_SIZE": "8"}, None),                            # nothing says the local size
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "zero"}, None),
])
def test_mpi_local_size_comes_from_the_launchers_variables(environ, expected):
    assert cores.launcher_local_size("mpi", environ) == expected


def test_tcp_local_size_is_torchruns_variable_and_only_that():
    assert cores.launcher_local_size("tcp", {"LOCAL_WORLD_SIZE": "2", "MPI_LOCALNRANKS": "8"}) == 2
    assert cores.launcher_local_size("tcp", {"MPI_LOCALNRANKS": "8"}) is None
    assert cores.launcher_local_size("processes", {"LOCAL_WORLD_SIZE": "2"}) is None


def reports(*ranks: tuple[str, set[int]]) -> np.ndarray:
    return np.concatenate([cores.host_report(cpus, host) for host, cpus in ranks])


def test_ranks_on_other_hosts_or_on_other_cores_do_not_share():
    two_hosts = reports(("a", {0, 1, 2, 3}), ("a", {0, 1, 2, 3}), ("b", {0, 1, 2, 3}))
    assert [cores.sharing_from_reports(two_hosts, r) for r in range(3)] == [2, 2, 1]
    bound = reports(("a", {0, 1}), ("a", {2, 3}), ("a", {2, 3}))  # a launcher's binding: 1 | 2, 3
    assert [cores.sharing_from_reports(bound, r) for r in range(3)] == [1, 2, 2]


def _peer_threads(comm, emit, environ):
    return cores.threads_for_peer_rank(comm, "mpi", 0, environ)


def test_peer_ranks_learn_who_shares_their_host_at_start_up():
    # Two thread ranks on this host with the same CPUs: each gets half; a launcher stating one rank per
    # node (it knows better than host names) leaves each all of them.
    assert run_ranks(2, "threads", _peer_threads, args=({},)) == [max(1, HOST_CORES // 2)] * 2
    assert run_ranks(2, "threads", _peer_threads, args=({"MPI_LOCALNRANKS": "1"},)) == [HOST_CORES] * 2


def test_threads_backend_sizes_the_shared_pool_while_the_ranks_run_and_restores_it():
    before, kernels_before = blas_pools(), thread_pool.threads()
    results = run_ranks(2, "threads", comm_helpers.pool_sizes)
    expected = max(1, HOST_CORES // 2)
    assert [r["resolved"] for r in results] == [expected] * 2
    assert [r["blas"] for r in results] == [[expected] * len(before)] * 2
    assert [r["kernels"] for r in results] == [expected] * 2  # ranks x threads never exceed the cores
    assert blas_pools() == before and thread_pool.threads() == kernels_before
    one = run_ranks(1, "threads", comm_helpers.pool_sizes, threads_per_rank=1)[0]
    assert one["blas"] == [1] * len(before) and one["kernels"] == 1
    two = run_ranks(1, "threads", comm_helpers.pool_sizes, threads_per_rank=2)[0]
    assert two["kernels"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("world, configured", [(2, 0), (1, 1)])
def test_processes_backend_ranks_blas_pool_has_the_configured_size(world, configured):
    results = run_ranks(world, "processes", comm_helpers.pool_sizes, timeout_s=60,
                        threads_per_rank=configured)
    expected = configured or max(1, HOST_CORES // world)
    for r in results:
        assert r["resolved"] == expected
        # threadpoolctl, asked inside the rank process: NumPy's BLAS, and MKL where the mkl extra is installed
        assert r["blas"] and r["blas"] == [expected] * len(r["blas"]), r
        assert r["kernels"] == expected, r  # engine.fast.thread_pool' pool, the same share


def test_threads_per_rank_is_validated_and_recorded(tmp_path):
    with pytest.raises(ConfigError, match="parallel.threads_per_rank"):
        from_dict({"parallel": {"threads_per_rank": -1}})
    cfg = from_dict(dict(tiny_gpt(train__steps=2), run={"out_dir": str(tmp_path)},
                         parallel={"world_size": 2, "threads_per_rank": 1}))
    seen = []
    summary = run_training(cfg, on_event=seen.append)
    started = next(e for e in seen if type(e).__name__ == "RunStarted")
    assert started.threads_per_rank == 1 and summary["threads_per_rank"] == 1
    recorded = json.loads((tmp_path / os.listdir(tmp_path)[0] / "summary.json").read_text())
    assert recorded["threads_per_rank"] == 1
