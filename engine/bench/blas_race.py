"""Our training step with its matrix products on engine.fast.blas.gemm (MKL with the `mkl` extra) and on
np.matmul, and PyTorch's two twins, taking turns in blocks of steps in one process and one thread: the
in-step effect of the BLAS as ratios taken under the same machine load.

    python -m engine.bench.blas_race [preset] [steps] [threads] [--set key=value ...]

On one thread the figures are CPU seconds of the one thread that computes them all (time.thread_time): ratios
that hold while other work shares the cores. On more, wall seconds.

engine.ops.matmul_kernel's products are routed through blas.gemm here (this module sets it, with the
arithmetic matmul_kernel has); the np.matmul turns turn MKL off for their steps. Prints each contestant's
median step and ours / PyTorch for both BLAS.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

import engine.bench.torch_first  # noqa: F401 - torch before our first product (engine/bench/torch_first.py)
from engine import ops
from engine.bench.turns import TWINS, print_race, race_arguments, race_in_turns
from engine.config import Config
from engine.fast import blas


def _route_products_through_gemm() -> None:
    """matmul_kernel as engine.ops has it, with blas.gemm where it calls np.matmul."""
    import numpy as np

    from engine.dtypes import LOW_PRECISION
    from engine.fast import lowp

    def matmul_kernel(a, b, out_dtype=None):
        out_dtype = np.result_type(a.dtype, b.dtype) if out_dtype is None else np.dtype(out_dtype)
        if a.dtype in LOW_PRECISION or b.dtype in LOW_PRECISION or out_dtype in LOW_PRECISION:
            with np.errstate(over="ignore", invalid="ignore"):
                return lowp.narrow(blas.gemm(lowp.widen(a), lowp.widen(b)), out_dtype)
        return blas.gemm(a, b)
    ops.matmul_kernel = matmul_kernel


@contextlib.contextmanager
def _numpy_blas():
    """Every blas.gemm call on np.matmul inside the block."""
    library = blas._library
    blas._library = lambda: None
    try:
        yield
    finally:
        blas._library = library


def race(cfg: Config, steps: int = 15, warmup: int = 2, threads: int = 2) -> dict:
    """Median seconds per step of each contestant: wall time, or on one thread this thread's CPU time (every
    product and kernel then runs on the calling thread, so the figure holds on a loaded machine)."""
    _route_products_through_gemm()
    ours: dict[str, Callable[[], AbstractContextManager]] = {"ours gemm": contextlib.nullcontext,
                                                             "ours np.matmul": _numpy_blas}
    clock = time.thread_time if threads == 1 else time.perf_counter
    med = race_in_turns(cfg, ours, steps, warmup, threads, clock)
    return {"median_s": {k: med[k] for k in (*ours, *TWINS)}, "backend": blas.backend(), "threads": threads,
            "steps": med["steps"], "ratios": {f"{o} / {p}": med[o] / med[p] for o in ours for p in TWINS},
            "gemm / np.matmul": med["ours gemm"] / med["ours np.matmul"]}


def main(argv: list[str]) -> None:
    preset, cfg, steps, threads = race_arguments(argv, "gpt-baby")
    r = race(cfg, steps, threads=threads)
    clock = "CPU s of the one thread" if threads == 1 else "wall s"
    print(f"{preset}: {r['steps']} timed steps each, {threads} thread(s), {clock}, gemm on {r['backend']}")
    print_race(r)
    print(f"  ours gemm / ours np.matmul {r['gemm / np.matmul']:.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
