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
import statistics
import sys
import time

import engine.bench.torch_first  # noqa: F401 - torch before our first product (engine/bench/torch_first.py)
from engine import ops
from engine.bench.step import SETTLE
from engine.config import Config, replace
from engine.fast import blas

KEEP = 5  # timed steps per block, after SETTLE untimed ones


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
    clock = time.thread_time if threads == 1 else time.perf_counter
    import torch

    from engine.bench.torch_peer import torch_adamw, torch_model_from, torch_train_step
    from engine.comm.base import Signals
    from engine.comm.cores import limited
    from engine.comm.threads import ThreadGroup
    from engine.trainer import Trainer
    _route_products_through_gemm()
    torch.set_num_threads(threads)
    cfg = replace(replace(cfg, "train.steps", 10**6), "train.eval_every", 0)
    times: dict[str, list[float]] = {"ours gemm": [], "ours np.matmul": [], "torch": [], "torch sdpa": []}
    with limited(threads):
        ours = Trainer(cfg, ThreadGroup(1, cfg.parallel.timeout_s, Signals()).communicator(0))
        twins = {k: torch_model_from(ours.model, fused_attention=k == "torch sdpa")
                 for k in ("torch", "torch sdpa")}
        opts = {k: torch_adamw(t, cfg.optim) for k, t in twins.items()}

        def step(name: str, i: int) -> float:
            t0 = clock()
            if name.startswith("ours"):
                with contextlib.nullcontext() if name == "ours gemm" else _numpy_blas():
                    ours.train_step()
            else:
                x, y = ours.dataset.global_batch(i, "train")
                torch_train_step(twins[name], opts[name], x, y, cfg.optim.grad_clip)
            return clock() - t0

        try:
            for name in times:
                for i in range(warmup):
                    step(name, i)
            r = 0
            while len(times["torch"]) < steps:
                order = list(times) if r % 2 == 0 else list(reversed(times))
                for name in order:
                    block = [step(name, i) for i in range(SETTLE + KEEP)]
                    times[name] += block[SETTLE:]
                r += 1
        finally:
            ours.replica.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"median_s": med, "backend": blas.backend(), "threads": threads, "steps": len(times["torch"]),
            "ratios": {f"{o} / {p}": med[o] / med[p] for o in ("ours gemm", "ours np.matmul")
                       for p in ("torch", "torch sdpa")},
            "gemm / np.matmul": med["ours gemm"] / med["ours np.matmul"]}


def main(argv: list[str]) -> None:
    from engine.config.presets import load_preset
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    args = [a for i, a in enumerate(argv) if a != "--set" and (i == 0 or argv[i - 1] != "--set")]
    preset = args[0] if args else "gpt-baby"
    steps, threads = (int(args[1]) if len(args) > 1 else 15), (int(args[2]) if len(args) > 2 else 2)
    cfg = load_preset(preset, sets)[0]
    r = race(cfg, steps, threads=threads)
    clock = "CPU s of the one thread" if threads == 1 else "wall s"
    print(f"{preset}: {r['steps']} timed steps each, {threads} thread(s), {clock}, gemm on {r['backend']}")
    for name, s in r["median_s"].items():
        print(f"  {name:16s} {s * 1e3:8.1f} ms")
    for name, v in r["ratios"].items():
        print(f"  {name:28s} {v:.3f}")
    print(f"  ours gemm / ours np.matmul {r['gemm / np.matmul']:.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
