"""Rank functions for the comm tests. They live in an importable module so the processes and mpi
backends can run them, and they return plain JSON (failures, digests, byte counts).

As a script it runs the conformance job on one rank of an external launch and prints JSON:
``mpiexec -n 4 python tests/comm_helpers.py`` (rank 0 prints every rank's results; ``native``
checks the mpi-native all-reduce, ``algorithms G`` every all-reduce algorithm on every group of a
G-ranks-per-node grid), or ``python tests/comm_helpers.py tcp [algorithms G]`` with the torchrun-style
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
from engine.comm.auto import Crossovers  # noqa: E402
from engine.comm.group import Group, NodeGrid  # noqa: E402

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
    """np.max, or np.sum in float64 for floats (exact for the small integers of float16/bfloat16) and in
    the integer dtype itself for integers (wrapping, as the collectives do)."""
    stack, dt = np.stack(inputs), inputs[0].dtype
    if op == "max":
        return stack.max(axis=0)
    if dtype in LOW_PRECISION or dt.kind == "f":
        total = stack.astype(np.float64).sum(axis=0)
        total = total / len(inputs) if op == "avg" else total
        return total.astype(dt) if dtype in LOW_PRECISION else total
    return stack.sum(axis=0, dtype=dt)


def matches(dtype: str, got: np.ndarray, want: np.ndarray) -> bool:
    if dtype in ("float32", "float64"):
        tol = 1e-12 if dtype == "float64" else 1e-5
        return bool(np.allclose(got.astype(np.float64), want, rtol=tol, atol=tol))
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


ALGORITHMS = ("ring", "rhd", "tree", "auto")  # on any communicator; "hierarchical" needs a node grid
GROUP_DTYPES = ["bfloat16", "float64", "int32"]  # in groups: low precision, float, integer
# "auto" under crossovers that switch inside the sizes tested (the defaults switch at kilobytes)
AUTO_RULES = Crossovers(((64, "tree"), (2048, "rhd"), (float("inf"), "hierarchical")))


def views(comm, ranks_per_node: int) -> list[tuple[str, object, object]]:
    """(view, communicator, its node grid or None) this rank belongs to: the world, and with a node grid
    its node and its cross-node column; with N >= 3, every rank but rank 1 in reverse order (a group that
    is a strict subset with its ranks renumbered)."""
    size = comm.world_size
    grid = NodeGrid(comm, ranks_per_node) if ranks_per_node else None
    out: list[tuple[str, object, object]] = [("world", comm, grid)]
    if grid is not None:
        out += [("node", grid.intra, None), ("cross", grid.inter, None)]
    subset = [r for r in reversed(range(size)) if r != 1]
    if size >= 3 and comm.rank in subset:
        out.append(("subset", Group(comm, subset, "subset"), None))
    return out


def algorithm_conformance(comm, emit, ranks_per_node: int = 0, seed: int = 1) -> dict:
    """all_reduce with every algorithm on every view (world, node, cross-node, subset): results against
    the reference, digests (ranks of one view must agree bitwise) and the bytes sent by phase and group,
    with the global ranks and algorithm labels the meter booked."""
    rank = comm.rank
    comm.meter = TrafficMeter(rank)
    failures, digests, traffic = [], {}, []
    for view, sub, grid in views(comm, ranks_per_node):
        algorithms = ALGORITHMS + (("hierarchical",) if grid is not None else ())
        members = [sub.global_rank(r) for r in range(sub.world_size)]
        for algorithm in algorithms:
            for dtype in DTYPES if view == "world" else GROUP_DTYPES:
                ops = ["sum", "max"] + (["avg"] if dtype not in ("int32", "int64") else [])
                for n in sizes_for(sub.world_size):
                    inputs = [rank_input(dtype, n, r, seed) for r in members]
                    for op in ops:
                        case = f"{view}/{algorithm}/{op}/{dtype}/{n}"
                        buf = inputs[sub.rank].copy()
                        comm.meter.begin_step(0)
                        all_reduce(sub, buf, op, algorithm, grid=grid, crossovers=AUTO_RULES,
                                   segment_bytes=SEGMENT)
                        if not matches(dtype, buf, reference(dtype, op, inputs)):
                            failures.append(case)
                        digests[case] = digest(buf)
                        links = comm.meter.snapshot()
                        if any(link["src"] != rank or link["dst"] not in members for link in links):
                            failures.append(f"{case}: a link outside the view {members}: {links}")
                        by_phase: dict[str, int] = {}
                        for link in links:
                            where = f"{link['phase']}@{link['group']}"
                            by_phase[where] = by_phase.get(where, 0) + link["bytes"]
                        traffic.append({"view": view, "algorithm": algorithm, "op": op, "dtype": dtype,
                                        "n": n, "itemsize": buf.itemsize, "rank": sub.rank,
                                        "size": sub.world_size, "group": sub.name, "bytes": by_phase,
                                        "labels": sorted({link["algorithm"] for link in links})})
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
    """What this rank's thread pools are, as threadpoolctl reports them from inside the rank (BLAS) and as
    engine.fast.thread_pool reports its own (the kernels', the shared elementwise work's), beside the figure
    run_ranks resolved and the CPUs the rank may use."""
    from threadpoolctl import threadpool_info

    from engine.fast import thread_pool
    from engine.ops import matmul_kernel
    matmul_kernel(np.ones((8, 8), np.float32), np.ones((8, 8), np.float32))  # as the rank's products see them
    blas = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
    return {"rank": comm.rank, "blas": blas, "kernels": thread_pool.threads(),
            "resolved": comm.threads_per_rank,
            "cores": sorted(os.sched_getaffinity(0))}


# ---------------------------------------------------------------------------------------- their checks
# Each algorithm's bytes, written out here from its definition (not imported from the engine).

def ring_elements(n: int, size: int, rank: int) -> tuple[int, int]:
    """A ring reduce-scatter sends every shard but the rank's own, an all-gather every shard but the next
    rank's."""
    shard = [e - s for s, e in (shard_bounds(n, size, r) for r in range(size))]
    return n - shard[rank], n - shard[(rank + 1) % size]


def tree_parent(q: int) -> int:
    return q - (q & -q)  # clear the lowest set bit: the binomial tree rooted at 0


def expected_elements(algorithm: str, n: int, size: int, rank: int, group: str, grid: int) -> dict:
    """Elements `rank` sends per 'phase@group' (None where the formula is only fixed in aggregate)."""
    if algorithm == "ring":
        rs, ag = ring_elements(n, size, rank)
        return {f"reduce-scatter@{group}": rs, f"all-gather@{group}": ag}
    if algorithm == "tree":
        kids = sum(1 for q in range(1, size) if tree_parent(q) == rank)
        return {f"reduce@{group}": n if rank else 0, f"broadcast@{group}": kids * n}
    if algorithm == "rhd":
        power = 1 << (size.bit_length() - 1)
        extra = size - power
        if rank < 2 * extra and rank % 2 == 0:  # folded into rank + 1: sends its buffer, gets the result
            return {f"reduce@{group}": n}
        me = rank // 2 if rank < 2 * extra else rank - extra
        lo, hi = shard_bounds(n, power, me)
        out = {f"reduce-scatter@{group}": n - (hi - lo),
               f"all-gather@{group}": n - n // power if n % power == 0 else None}
        if rank < 2 * extra:
            out[f"broadcast@{group}"] = n
        return out
    assert algorithm == "hierarchical"
    node, local = divmod(rank, grid)
    lo, hi = shard_bounds(n, grid, local)
    rs, ag = ring_elements(n, grid, local)
    cross_rs, cross_ag = ring_elements(hi - lo, size // grid, node)
    return {f"reduce-scatter@node{node}": rs, f"all-gather@node{node}": ag,
            f"all-reduce@cross{local}": cross_rs + cross_ag}


def chosen_by_auto(t: dict, grid: int) -> str:
    """What the conformance job's crossovers pick for the size; hierarchical falls back to the ring
    where the view has no two-level grid."""
    chosen = AUTO_RULES.choose(t["n"] * t["itemsize"])
    two_level = t["view"] == "world" and 1 < grid < t["size"]
    return "ring" if chosen == "hierarchical" and not two_level else chosen


def assert_algorithms_exact(results, ranks_per_node: int) -> None:
    """Every rank's results equal the reference, and every view a rank belongs to was run."""
    world_size = len(results)
    assert [r["rank"] for r in results] == list(range(world_size))
    for result in results:
        assert result["failures"] == [], f"rank {result['rank']}: {result['failures'][:5]}"
    views = {t["view"] for r in results for t in r["traffic"]}
    assert "world" in views and ("subset" in views) == (world_size >= 3)
    assert ({"node", "cross"} <= views) == bool(ranks_per_node)


def assert_bitwise_within_groups(results) -> None:
    """The ranks of one group end every case with the same bits."""
    by_group: dict = {}
    for result in results:
        for t in result["traffic"]:
            case = f"{t['view']}/{t['algorithm']}/{t['op']}/{t['dtype']}/{t['n']}"
            by_group.setdefault((t["group"], case), set()).add(result["digests"][case])
    assert by_group and all(len(digests) == 1 for digests in by_group.values())


def assert_algorithm_bytes(results, ranks_per_node: int) -> None:
    """Each rank's bytes per phase and group against the algorithm's formula; auto's against the formula of
    the algorithm its default crossovers name for the size, which is also the label the meter shows."""
    aggregate: dict = {}
    closed_forms = 0
    for result in results:
        for t in result["traffic"]:
            algorithm = chosen_by_auto(t, ranks_per_node) if t["algorithm"] == "auto" else t["algorithm"]
            n, item, size = t["n"], t["itemsize"], t["size"]
            want = expected_elements(algorithm, n, size, t["rank"], t["group"], ranks_per_node)
            got = dict(t["bytes"])
            for where, elements in want.items():
                if elements is None:  # fixed in aggregate only: summed over the ranks below
                    key = (t["group"], t["algorithm"], t["op"], t["dtype"], n, item, size, where)
                    aggregate[key] = aggregate.get(key, 0) + got.pop(where, 0)
                elif elements:
                    assert got.pop(where, 0) == elements * item, (t, where)
            assert got == {}, (t, "unexpected traffic")
            if algorithm == "hierarchical":  # inside the node its own name; across, the ring it runs there
                inside = any(w.startswith(("reduce-scatter@node", "all-gather@node")) for w in t["bytes"])
                across = any(w.startswith("all-reduce@cross") for w in t["bytes"])
                want = ({"hierarchical"} if inside else set()) | ({"ring"} if across else set())
                assert t["labels"] == sorted(want), t
            elif t["bytes"]:
                assert t["labels"] == [algorithm], t
            if algorithm == "hierarchical" and n % ranks_per_node == 0 and \
                    (n // ranks_per_node) % (size // ranks_per_node) == 0:
                g, m = ranks_per_node, size // ranks_per_node
                node = t["bytes"].get(f"reduce-scatter@node{t['rank'] // g}", 0) + \
                    t["bytes"].get(f"all-gather@node{t['rank'] // g}", 0)
                cross = t["bytes"].get(f"all-reduce@cross{t['rank'] % g}", 0)
                assert node * g == 2 * (g - 1) * n * item and cross * m * g == 2 * (m - 1) * n * item
                closed_forms += 1
            power = 1 << (size.bit_length() - 1)  # rhd: 2(P−1)/P·S on the ranks that are not folded
            if (algorithm == "ring" and n % size == 0) or \
                    (algorithm == "rhd" and n % power == 0 and t["rank"] >= 2 * (size - power)):
                p = size if algorithm == "ring" else power
                assert sum(t["bytes"].values()) * p == 2 * (p - 1) * n * item, t
                closed_forms += 1
    for key, total in aggregate.items():  # rhd's doubling: the participants send (P−1)·n between them
        _, _, _, _, n, item, size, _ = key
        power = 1 << (size.bit_length() - 1)
        assert total == (power - 1) * n * item, key
    assert closed_forms > 0 or len(results) == 1


if __name__ == "__main__":
    from engine.comm import run_ranks

    # comm_helpers.py [tcp] [conformance | native | pools | algorithms G]
    args = sys.argv[1:]
    transport = args.pop(0) if args[:1] == ["tcp"] else "mpi"
    mode = args[0] if args else "conformance"
    extra = tuple(int(a) for a in args[1:])
    check = {"native": native_check, "pools": pool_sizes, "algorithms": algorithm_conformance}.get(mode,
                                                                                                 conformance)
    if transport == "tcp":  # one rank of a torchrun-style job, configured by the environment
        rank = int(os.environ["RANK"])
        print(json.dumps(run_ranks(int(os.environ["WORLD_SIZE"]), "tcp", check, extra, timeout_s=120)[rank]))
    else:
        from mpi4py import MPI

        results = run_ranks(MPI.COMM_WORLD.Get_size(), "mpi", check, extra, timeout_s=120)
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


def slow_rank(comm, emit, slow: int, busy_s: float, steps: int = 3) -> int:
    """Rank ``slow`` computes for ``busy_s`` (longer than the job's timeout) before each all-reduce while the
    others wait on it: slow, never silent. Returns the steps done, each checked against the exact sum."""
    buf = np.empty(4096, np.float64)
    for step in range(steps):
        if comm.rank == slow:
            end = time.monotonic() + busy_s
            while time.monotonic() < end:
                sum(range(1000))  # pure computation, no communication: only its CPU time moves
        buf[:] = comm.rank + step
        all_reduce(comm, buf)
        assert np.all(buf == sum(range(comm.world_size)) + comm.world_size * step)
        emit({"rank": comm.rank, "step": step})
    return steps
