"""Calibrating the transport: α, β, γ of nanoDist's own ring at the sizes a run sends (calibrate.py keeps
them in the calibration file beside the compute figures).

Two ranks time our ring reduce-scatter and all-gather at the bucket sizes the run uses and
sizes around them; fit.fit_ring turns them into α, β, γ. γ is measured per precision: 16-bit buffers
are reduced through float32 (engine.comm.collectives), several times the work of a float32 sum.
The same collectives' CPU time (the calling thread's, time.thread_time: the socket transport sends,
receives, copies and reduces on the thread that calls it) is fitted the same way into the CPU's α, β,
γ ("cpu"): what a collective takes from the cores it shares with compute. It is more than the copying
(n·β): each message costs the transport's framing, system calls, shared-memory slot and ACK handling,
the Python of the ring, on the CPU, which is most of a small message's α on one host.
Every repetition starts with cold caches (each rank first writes EVICT_BYTES), as a training step's
collectives do: between two of them backward or the update streams activations, weights and optimizer
state through the caches, so a bucket, the shared-memory slots and the transport's own code and data
come from memory again. Timed back to back instead, a 1 MiB all-reduce here costs half the CPU time and
wall time it costs inside a step.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np

from engine.comm.collectives import all_gather, reduce_scatter
from engine.comm.launch import run_ranks
from engine.config import Config
from engine.projection.fit import fit_ring
from engine.projection.quantile import low_quantile

EVICT_BYTES = 64 << 20  # written before each timed collective: more than this host's caches hold per core


def default_transport_sizes(cfg: Config, vocab: int) -> list[int]:
    """The bucket sizes of cfg's model at its bucket cap (what its steps send), and sizes around them."""
    from engine.config.build import param_shapes
    from engine.dtypes import itemsize
    from engine.parallel.data.flat import FlatLayout
    shapes = [(name, shape) for name, shape, _ in param_shapes(cfg, vocab)]
    layout = FlatLayout(shapes, cfg.precision.dtype, 2)
    cap = cfg.parallel.bucket_cap_mb * 2**20
    buckets = [(b - a) * itemsize(cfg.precision.dtype) for a, b in layout.buckets(cap)]
    around = [4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 8 << 20]
    return sorted({max(64, int(n) // 64 * 64) for n in [*buckets, *around]})


def measure_ring(sizes: list[int], dtypes=("fp32",), ranks: int = 2, repeats: int = 12) -> dict:
    """α, β (all-gathers) and γ per precision (reduce-scatters) of our ring on the processes backend, in
    wall-clock time (the slowest rank's) and in CPU time ("cpu": the mean rank's, each pays its own)."""
    kinds = ["fp32", *(d for d in dtypes if d != "fp32")]
    results = run_ranks(ranks, "processes", _ring_rank, (list(sizes), kinds, repeats), timeout_s=120.0)

    def slowest(key: str) -> list[float]:
        return [max(r[key][i] for r in results) for i in range(len(sizes))]

    def mean(key: str) -> list[float]:
        return [statistics.mean(r[key][i] for r in results) for i in range(len(sizes))]
    return {**ring_figures(ranks, sizes, kinds, slowest), "cpu": ring_figures(ranks, sizes, kinds, mean,
                                                                               prefix="cpu "),
            "ranks": ranks, "sizes": list(sizes)}


def ring_figures(ranks: int, sizes: list[int], kinds: list[str], column: Callable[[str], list[float]],
                 prefix: str = "") -> dict:
    """α, β, γ (and γ per precision) fitted to the times `column(prefix + "gather")` and
    `column(prefix + "scatter <dtype>")` at `sizes`."""
    gather = column(prefix + "gather")
    fitted = fit_ring(ranks, sizes, gather, column(prefix + "scatter fp32"))
    gammas = {d: fit_ring(ranks, sizes, gather, column(f"{prefix}scatter {d}"))["gamma"] for d in kinds}
    return {**fitted, "gamma_by_dtype": gammas, "gather_s": gather,
            "scatter_s": column(prefix + "scatter fp32")}


def _ring_rank(comm, emit, sizes: list[int], dtypes: list[str], repeats: int) -> dict:
    from engine.dtypes import resolve_dtype
    evict = np.empty(EVICT_BYTES, np.uint8)
    names = ["gather", *(f"scatter {d}" for d in dtypes)]
    out: dict[str, list[float]] = {f"{kind}{name}": [] for name in names for kind in ("", "cpu ")}
    for size in sizes:
        runs: list[tuple[str, Callable, np.ndarray]] = [("gather", all_gather,
                                                          np.ones(size // 4, np.float32))]
        for d in dtypes:
            dtype = resolve_dtype(d)
            runs.append((f"scatter {d}", reduce_scatter, np.ones(size // dtype.itemsize, dtype)))
        for name, collective, buf in runs:
            times, cpu = [], []
            for k in range(repeats + 2):
                evict.fill(k)  # the caches as a step leaves them (see the module docstring)
                comm.barrier()
                t0, c0 = time.perf_counter(), time.thread_time()
                collective(comm, buf)
                times.append(time.perf_counter() - t0)
                cpu.append(time.thread_time() - c0)
            out[name].append(low_quantile(times[2:]))
            out["cpu " + name].append(low_quantile(cpu[2:]))
    return out
