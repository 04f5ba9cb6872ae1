"""Rank functions for the comm tests. They live in an importable module so the processes and mpi
backends can run them, and they return plain JSON (failures, digests, byte counts).

As a script it runs the conformance job on one rank of an external launch and prints JSON:
``mpiexec -n 4 python tests/comm_helpers.py`` (rank 0 prints every rank's results; ``native``
checks the mpi-native all-reduce), or ``python tests/comm_helpers.py tcp`` with the torchrun-style
environment (each rank prints its own).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

import ml_dtypes
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.comm import TrafficMeter, all_gather, all_reduce, broadcast, reduce_scatter, shard_bounds  # noqa: E402

DTYPES = ["float16", "bfloat16", "float32", "float64", "int32", "int64"]
LOW_PRECISION = ("float16", "bfloat16")


SEGMENT = 1024  # small segments, so modest buffers already span several of them


def sizes_for(world_size: int) -> list[int]:
    """0, 1, N−1, N+1, divisible, not divisible, and shards spanning several segments."""
    return sorted({0, 1, world_size - 1, world_size + 1, 8 * world_size, 8 * world_size + 3,
                   300 * world_size, 300 * world_size + 1})


def rank_input(dtype: str, n: int, rank: int, seed: int) -> np.ndarray:
    """Deterministic per-rank data; float16/bfloat16 get small integers so every sum is exact."""
    rng = np.random.default_rng([seed, n, rank])
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    if dtype in LOW_PRECISION:
        return rng.integers(-8, 9, n).astype(dt)
    if dt.kind == "f":
        return rng.standard_normal(n).astype(dt)
    info = np.iinfo(dt)
    return rng.integers(info.min // 2, info.max // 2, n, dtype=dt, endpoint=True)  # sums wrap: still exact


def reference(dtype: str, op: str, inputs: list[np.ndarray]) -> np.ndarray:
    stack, dt = np.stack(inputs), inputs[0].dtype
    if op == "max":
        return stack.max(axis=0)
    if dtype in LOW_PRECISION:
        total = stack.astype(np.float32).sum(axis=0)
        return (total / len(inputs) if op == "avg" else total).astype(dt)
    total = stack.sum(axis=0, dtype=dt)
    return total / len(inputs) if op == "avg" else total


def matches(dtype: str, got: np.ndarray, want: np.ndarray) -> bool:
    if dtype in ("float32", "float64"):
        tol = 1e-12 if dtype == "float64" else 1e-5
        return bool(np.allclose(got, want, rtol=tol, atol=tol))
    return got.tobytes() == want.tobytes()  # integers, max, and exact low-precision sums: bitwise


def digest(arr: np.ndarray) -> str:
    return hashlib.sha256(arr.tobytes()).hexdigest()[:16]


def conformance(comm, emit, seed: int = 0) -> dict:
    """Every collective on every dtype and awkward size; returns failures, digests, bytes sent."""
    size, rank = comm.world_size, comm.rank
    comm.meter = TrafficMeter(rank)
    failures, digests, traffic = [], {}, []
    for dtype in DTYPES:
        ops = ["sum", "max"] + (["avg"] if dtype not in ("int32", "int64") else [])
        for n in sizes_for(size):
            inputs = [rank_input(dtype, n, r, seed) for r in range(size)]
            for op in ops:
                case = f"all_reduce/{op}/{dtype}/{n}"
                buf = inputs[rank].copy()
                comm.meter.begin_step(len(traffic))
                all_reduce(comm, buf, op, segment_bytes=SEGMENT)
                if not matches(dtype, buf, reference(dtype, op, inputs)):
                    failures.append(case)
                digests[case] = digest(buf)
                traffic.append({"dtype": dtype, "n": n, "op": op, "itemsize": buf.itemsize,
                                "rs": comm.meter.bytes_sent("reduce-scatter"),
                                "ag": comm.meter.bytes_sent("all-gather"), "total": comm.meter.bytes_sent()})
            buf = inputs[rank].copy()
            start, end = reduce_scatter(comm, buf, "sum", segment_bytes=SEGMENT)
            if (start, end) != shard_bounds(n, size, rank) or \
                    not matches(dtype, buf[start:end], reference(dtype, "sum", inputs)[start:end]):
                failures.append(f"reduce_scatter/{dtype}/{n}")
            gathered = np.zeros_like(inputs[rank])
            gathered[start:end] = inputs[rank][start:end]
            all_gather(comm, gathered, segment_bytes=SEGMENT)
            want = np.concatenate([inputs[r][slice(*shard_bounds(n, size, r))] for r in range(size)])
            if gathered.tobytes() != want.tobytes():
                failures.append(f"all_gather/{dtype}/{n}")
            root = size - 1
            buf = inputs[rank].copy()
            comm.meter.begin_step(-1)
            broadcast(comm, buf, root, segment_bytes=SEGMENT)
            if buf.tobytes() != inputs[root].tobytes():
                failures.append(f"broadcast/{dtype}/{n}")
            if comm.meter.bytes_sent("broadcast") != (buf.nbytes if rank != (root - 1) % size else 0):
                failures.append(f"broadcast-bytes/{dtype}/{n}")
    failures += _point_to_point(comm)
    comm.barrier()
    return {"rank": rank, "failures": failures, "digests": digests, "traffic": traffic}


def _point_to_point(comm) -> list[str]:
    """FIFO order between a pair; sendrecv around the ring (must not deadlock); a message larger than
    a shared-memory slot and the socket scratch buffer, received with reduce."""
    if comm.world_size == 1:
        return []
    nxt, prv = (comm.rank + 1) % comm.world_size, (comm.rank - 1) % comm.world_size
    failures = []
    for k in range(3):
        out = np.full(16, comm.rank * 10 + k, np.int64)
        got = np.empty(16, np.int64)
        comm.sendrecv(nxt, out, prv, got)
        if not (got == prv * 10 + k).all():
            failures.append(f"sendrecv-order/{k}")
    big = np.arange(400_003, dtype=np.float32) + comm.rank
    acc = np.ones_like(big)
    comm.sendrecv(nxt, big, prv, acc, lambda a, b: np.add(a, b, out=a))
    if not np.array_equal(acc, np.arange(400_003, dtype=np.float32) + prv + 1):
        failures.append("sendrecv-reduce-large")
    return failures


def stop_when_asked(comm, emit, max_steps: int = 100000) -> int:
    """All-reduce in a loop until should_stop(); emits each step so the test can press stop."""
    buf = np.ones(1024, np.float32)
    for step in range(max_steps):
        if comm.should_stop():
            return step
        all_reduce(comm, buf)
        buf[:] = 1
        emit({"rank": comm.rank, "step": step, "pid": os.getpid()})
    return max_steps


def fail_on(comm, emit, bad_rank: int, how: str, hang_s: float = 60.0):
    """Rank ``bad_rank`` raises / hangs after two good steps; everyone reports its pid first."""
    emit({"rank": comm.rank, "pid": os.getpid()})
    buf = np.ones(4096, np.float32)
    for step in range(10000):
        if comm.rank == bad_rank and step == 2:
            if how == "raise":
                raise ValueError(f"boom on rank {comm.rank}")
            time.sleep(hang_s)
        all_reduce(comm, buf)
        buf[:] = 1
        emit({"rank": comm.rank, "step": step})
        time.sleep(0.01)


def native_check(comm, emit) -> dict:
    """all_reduce(algorithm="mpi-native") against the exact answer, for each op and some dtypes."""
    failures = []
    for dtype in ("bfloat16", "float32", "float64", "int64"):
        inputs = [rank_input(dtype, 1001, r, 5) for r in range(comm.world_size)]
        ops = ["sum", "max"] + (["avg"] if dtype != "int64" else [])
        for op in ops:
            buf = inputs[comm.rank].copy()
            all_reduce(comm, buf, op, algorithm="mpi-native")
            if not matches(dtype, buf, reference(dtype, op, inputs)):
                failures.append(f"{op}/{dtype}")
    return {"rank": comm.rank, "failures": failures}


def pool_sizes(comm, emit) -> dict:
    """What this rank's thread pools are, as threadpoolctl reports them from inside the rank, beside the
    figure run_ranks resolved and the CPUs the rank may use."""
    from threadpoolctl import threadpool_info
    blas = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
    return {"rank": comm.rank, "blas": blas, "resolved": comm.threads_per_rank,
            "cores": sorted(os.sched_getaffinity(0))}


if __name__ == "__main__":
    from engine.comm import run_ranks

    mode = sys.argv[1] if len(sys.argv) > 1 else "mpi"
    if mode == "tcp":  # one rank of a torchrun-style job, configured by the environment
        rank = int(os.environ["RANK"])
        print(json.dumps(run_ranks(int(os.environ["WORLD_SIZE"]), "tcp", conformance)[rank]))
    else:
        from mpi4py import MPI

        check = {"native": native_check, "pools": pool_sizes}.get(mode, conformance)
        results = run_ranks(MPI.COMM_WORLD.Get_size(), "mpi", check)
        if MPI.COMM_WORLD.Get_rank() == 0:
            print(json.dumps(results))


def slow_sendrecv(comm, emit, nbytes: int, timeout_s: float) -> float:
    """One sendrecv of nbytes with the peer under a short timeout; returns the seconds it took."""
    comm.timeout_s = timeout_s  # after the rendezvous, which needs the launch's longer timeout
    out, inc = np.ones(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
    peer = 1 - comm.rank
    start = time.perf_counter()
    comm.sendrecv(peer, out, peer, inc)
    assert inc.all()
    return time.perf_counter() - start
