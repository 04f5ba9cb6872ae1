"""All-to-all benchmark in the manner of NCCL-tests' alltoall_perf, for nanoDist's schedules and torch gloo.

S is the bytes each rank sends in all, cut into N equal blocks (block j to rank j, its own block kept), as
NCCL-tests defines it; algbw = S / t and busbw = algbw · (N−1)/N (meter.busbw "all-to-all"): the share of S
that crosses a link. Each iteration: barrier, time one all-to-all on every rank; the iteration's time is the
slowest rank's, a row reports the median over ``iters`` timed iterations after ``warmup`` untimed ones.
Every element says who sent it to whom, so ``correct`` is a bitwise comparison with the closed form.

The contestants take turns, iteration by iteration at each size, in the same rank processes, so every one
sees the same load: nanoDist's schedules (alltoall.ALGORITHMS: the even form, all_to_all_even, and with
``uneven`` the uneven one, all_to_all, whose row counts travel first) and, as "gloo", torch.distributed's
all_to_all_single on a gloo group over the same ranks (processes backend; torch imported only then).
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from engine.comm.alltoall import all_to_all, all_to_all_even
from engine.comm.launch import run_ranks
from engine.comm.meter import algbw, busbw

GLOO = "gloo"
UNEVEN = " uneven"  # suffix of a schedule timed through the uneven form


def bench_alltoall(backend: str = "processes", world_size: int = 2, sizes_bytes=(1 << 20, 1 << 24),
                   iters: int = 20, warmup: int = 3, contestants: tuple[str, ...] = ("pairwise", GLOO)
                   ) -> list[dict]:
    """Rows {size, contestant, time_s, algbw, busbw, correct}, by size then contestant in the order given:
    a schedule of alltoall.ALGORITHMS (the even form), the same name + " uneven" (the uneven form), or
    "gloo". Sizes are float32 bytes per rank, a multiple of 4·world_size. Under mpiexec only rank 0 gets
    rows; the others get []."""
    per_rank = run_ranks(world_size, backend, _rank, (list(sizes_bytes), iters, warmup, list(contestants)),
                         timeout_s=120.0)
    if any(rank_rows is None for rank_rows in per_rank):
        return []  # an MPI rank other than 0: rank 0 gathers and reports every rank's times
    rows = []
    for i, (size, contestant) in enumerate((s, c) for s in sizes_bytes for c in contestants):
        times = np.max([rank_rows[i]["times"] for rank_rows in per_rank], axis=0)  # slowest rank
        seconds = statistics.median(times.tolist())
        rows.append({"size": size, "contestant": contestant, "time_s": seconds, "algbw": algbw(size, seconds),
                     "busbw": busbw("all-to-all", size, seconds, world_size),
                     "correct": all(rank_rows[i]["correct"] for rank_rows in per_rank)})
    return rows


def blocks(size_bytes: int, rank: int, world_size: int) -> tuple[np.ndarray, np.ndarray]:
    """This rank's float32 send buffer (block j for rank j) and what it must receive (block j from rank j).
    Element i of the block src sends dst is (src·N + dst)·8 + i mod 8: exact in float32 up to N = 1024."""
    per_block = size_bytes // 4 // world_size
    tail = np.arange(per_block) % 8
    ids = np.arange(world_size)
    source = ((rank * world_size + ids[:, None]) * 8 + tail).astype(np.float32).reshape(-1)
    expected = ((ids[:, None] * world_size + rank) * 8 + tail).astype(np.float32).reshape(-1)
    return source, expected


def _rank(comm, emit, sizes, iters, warmup, contestants):
    """Per size, the contestants take turns each iteration; one row of times per (size, contestant)."""
    if GLOO in contestants:
        from engine.bench.ddp_peer import init_gloo
        init_gloo(comm)
    try:
        rows = []
        for size in sizes:
            source, expected = blocks(size, comm.rank, comm.world_size)
            times: list[list[float]] = [[] for _ in contestants]
            correct = [True] * len(contestants)
            for i in range(warmup + iters):
                turn = i % len(contestants)  # rotate who goes first: no contestant always follows another
                for k in list(range(turn, len(contestants))) + list(range(turn)):
                    comm.barrier()
                    start = time.perf_counter()
                    got = _one(comm, contestants[k], source)
                    if i >= warmup:
                        times[k].append(time.perf_counter() - start)
                    correct[k] = correct[k] and bool(np.array_equal(np.concatenate(got), expected))
            rows += [{"times": t, "correct": c} for t, c in zip(times, correct)]
        return rows
    finally:
        if GLOO in contestants:
            import torch.distributed as dist
            dist.destroy_process_group()


def _one(comm, contestant: str, source: np.ndarray) -> list[np.ndarray]:
    """One all-to-all of ``source`` by ``contestant``; what it received, as it returns it (joining the
    uneven form's blocks into one buffer is left outside the timing: a caller takes them as they are)."""
    if contestant == GLOO:
        import torch
        import torch.distributed as dist
        out = torch.empty(source.shape, dtype=torch.float32)
        dist.all_to_all_single(out, torch.from_numpy(source))
        return [out.numpy()]
    if contestant.endswith(UNEVEN):
        return all_to_all(comm, np.split(source, comm.world_size), algorithm=contestant[:-len(UNEVEN)])
    return [all_to_all_even(comm, source, algorithm=contestant)]
