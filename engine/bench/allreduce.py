"""All-reduce benchmark in the manner of NCCL-tests, for nanoDist's backends and for torch gloo.

Each iteration: restore the input (untimed), barrier, time one all-reduce on every rank; the
iteration's time is the slowest rank's, and a row reports the median over ``iters`` timed
iterations after ``warmup`` untimed ones. Inputs are small integers, so the float sum is exact
and ``correct`` is a bitwise comparison with the closed-form sum. Columns: algbw = S / t,
busbw = algbw · 2(N−1)/N (meter.busbw), in bytes/s. ``network`` emulates a slower network on the
processes backend (engine.comm.emulation): what the emulated links deliver is measured the same way.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from engine.comm.collectives import all_reduce
from engine.comm.emulation import NetworkEmulation
from engine.comm.launch import run_ranks
from engine.comm.meter import algbw, busbw
from engine.comm.wire import DTYPE_NAMES


def bench_allreduce(backend: str = "processes", world_size: int = 2, sizes_bytes=(1 << 24, 1 << 26),
                    iters: int = 20, warmup: int = 3, dtype: str = "float32",
                    algorithm: str = "ring", network: NetworkEmulation | None = None) -> list[dict]:
    """Rows {size, time_s, algbw, busbw, correct} for nanoDist's all-reduce on ``backend``
    (under mpiexec only rank 0 gets rows; the others get [])."""
    per_rank = run_ranks(world_size, backend, _nanodist_rank,
                         (list(sizes_bytes), iters, warmup, dtype, algorithm), timeout_s=120.0,
                         network=network)
    return _rows(per_rank, list(sizes_bytes), world_size)


def bench_gloo(world_size: int = 2, sizes_bytes=(1 << 24, 1 << 26), iters: int = 20, warmup: int = 3,
               dtype: str = "float32") -> list[dict] | None:
    """The same measurement for torch.distributed's gloo on loopback; None when torch is missing."""
    try:
        import torch.distributed  # noqa: F401 - only checking it is there
    except ImportError:
        return None
    per_rank = run_ranks(world_size, "processes", _gloo_rank, (list(sizes_bytes), iters, warmup, dtype),
                         timeout_s=120.0)
    return _rows(per_rank, list(sizes_bytes), world_size)


def _rows(per_rank: list, sizes: list[int], world_size: int) -> list[dict]:
    if any(rank_rows is None for rank_rows in per_rank):
        return []  # an MPI rank other than 0: rank 0 gathers and reports every rank's times
    rows = []
    for i, size in enumerate(sizes):
        times = np.max([rank_rows[i]["times"] for rank_rows in per_rank], axis=0)  # slowest rank
        seconds = statistics.median(times.tolist())
        rows.append({"size": size, "time_s": seconds, "algbw": algbw(size, seconds),
                     "busbw": busbw("all-reduce", size, seconds, world_size),
                     "correct": all(rank_rows[i]["correct"] for rank_rows in per_rank)})
    return rows


def _inputs(size_bytes: int, dtype: str, rank: int, world_size: int) -> tuple[np.ndarray, np.ndarray]:
    """This rank's input and the exact sum over ranks (small integers: every float sum is exact)."""
    dt = DTYPE_NAMES[dtype]
    pattern = np.arange(size_bytes // dt.itemsize) % 7
    return (pattern + rank).astype(dt), (pattern * world_size + world_size * (world_size - 1) // 2).astype(dt)


def _nanodist_rank(comm, emit, sizes, iters, warmup, dtype, algorithm):
    rows = []
    for size in sizes:
        source, expected = _inputs(size, dtype, comm.rank, comm.world_size)
        buf, times, correct = source.copy(), [], True
        for i in range(warmup + iters):
            np.copyto(buf, source)
            comm.barrier()
            start = time.perf_counter()
            all_reduce(comm, buf, "sum", algorithm)
            if i >= warmup:
                times.append(time.perf_counter() - start)
            correct = correct and bool(np.array_equal(buf, expected))
        rows.append({"times": times, "correct": correct})
    return rows


def _gloo_rank(comm, emit, sizes, iters, warmup, dtype):
    import torch
    import torch.distributed as dist

    from engine.bench.ddp_peer import init_gloo
    init_gloo(comm)
    try:
        rows = []
        for size in sizes:
            source, expected = _inputs(size, dtype, comm.rank, comm.world_size)
            tensor, times, correct = torch.from_numpy(source.copy()), [], True
            for i in range(warmup + iters):
                tensor.copy_(torch.from_numpy(source))
                dist.barrier()
                start = time.perf_counter()
                dist.all_reduce(tensor)
                if i >= warmup:
                    times.append(time.perf_counter() - start)
                correct = correct and bool(np.array_equal(tensor.numpy(), expected))
            rows.append({"times": times, "correct": correct})
        return rows
    finally:
        dist.destroy_process_group()
