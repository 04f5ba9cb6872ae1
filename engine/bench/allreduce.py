"""All-reduce benchmark in the manner of NCCL-tests, for nanoDist's backends and for torch gloo.

Each iteration: restore the input (untimed), barrier, time one all-reduce on every rank; the
iteration's time is the slowest rank's, and a row reports the median over ``iters`` timed
iterations after ``warmup`` untimed ones. Inputs are small integers, so the float sum is exact
and ``correct`` is a bitwise comparison with the closed-form sum. Columns: algbw = S / t,
busbw = algbw · 2(N−1)/N (meter.busbw), in bytes/s. ``network`` emulates a slower network on the
processes backend (engine.comm.emulation): what the emulated links deliver is measured the same way.

Several algorithms are measured in one run taking turns, iteration by iteration at each size, so every
one sees the same load (this machine's noise would otherwise decide the comparison). "hierarchical" runs
on the node grid of ``ranks_per_node``; "auto" picks with the crossovers it is given (what a training run
with this backend, world size and grid would look up), and its rows say what it chose.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from engine.comm.auto import Crossovers
from engine.comm.collectives import all_reduce, choose
from engine.comm.emulation import NetworkEmulation
from engine.comm.group import NodeGrid
from engine.comm.launch import run_ranks
from engine.comm.meter import algbw, busbw
from engine.comm.wire import DTYPE_NAMES


def bench_allreduce(backend: str = "processes", world_size: int = 2, sizes_bytes=(1 << 24, 1 << 26),
                    iters: int = 20, warmup: int = 3, dtype: str = "float32",
                    algorithm: str | tuple[str, ...] = "ring", ranks_per_node: int = 0,
                    crossovers: Crossovers | None = None,
                    network: NetworkEmulation | None = None) -> list[dict]:
    """Rows {size, algorithm, time_s, algbw, busbw, correct} (auto's also {chosen}) for nanoDist's
    all-reduce on ``backend``, by size, then algorithm in the order given (under mpiexec only rank 0
    gets rows; the others get [])."""
    algorithms = (algorithm,) if isinstance(algorithm, str) else tuple(algorithm)
    table = crossovers.to_array().tolist() if crossovers is not None else None
    per_rank = run_ranks(world_size, backend, _nanodist_rank,
                         (list(sizes_bytes), iters, warmup, dtype, list(algorithms), ranks_per_node, table),
                         timeout_s=120.0, network=network)
    if any(rank_rows is None for rank_rows in per_rank):
        return []  # an MPI rank other than 0: rank 0 gathers and reports every rank's times
    cases = [(size, a) for size in sizes_bytes for a in algorithms]
    rows = _rows(per_rank, [size for size, _ in cases], world_size)
    for row, (_, a), chosen in zip(rows, cases, per_rank[0]):
        row["algorithm"] = a
        if a == "auto":
            row["chosen"] = chosen["chosen"]
    return rows


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
    """One row per measured case (``sizes[i]`` bytes), from every rank's times."""
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


def _nanodist_rank(comm, emit, sizes, iters, warmup, dtype, algorithms, ranks_per_node, table):
    """Per size, the algorithms take turns each iteration; one row per (size, algorithm)."""
    grid = NodeGrid(comm, ranks_per_node) if ranks_per_node else None
    crossovers = Crossovers.from_array(np.array(table)) if table is not None else None
    rows = []
    for size in sizes:
        source, expected = _inputs(size, dtype, comm.rank, comm.world_size)
        buf = source.copy()
        times: list[list[float]] = [[] for _ in algorithms]
        correct = [True] * len(algorithms)
        for i in range(warmup + iters):
            turn = i % len(algorithms)  # rotate who goes first: no algorithm always follows another
            for k in list(range(turn, len(algorithms))) + list(range(turn)):
                np.copyto(buf, source)
                comm.barrier()
                start = time.perf_counter()
                all_reduce(comm, buf, "sum", algorithms[k], grid=grid, crossovers=crossovers)
                if i >= warmup:
                    times[k].append(time.perf_counter() - start)
                correct[k] = correct[k] and bool(np.array_equal(buf, expected))
        chosen = choose(comm, buf, grid, crossovers)
        rows += [{"times": t, "correct": c, "chosen": chosen} for t, c in zip(times, correct)]
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
