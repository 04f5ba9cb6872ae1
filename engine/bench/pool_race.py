"""Our training step with the rank's workers polling between shares (engine.fast.spin_pool) and sleeping
between them (the ThreadPoolExecutor's, products on MKL's own threads), and PyTorch's two twins, taking
turns in blocks of steps in one process: the pool's effect on a step as ratios taken under the same load.

    python -m engine.bench.pool_race [preset] [steps] [threads] [--set key=value ...]

Wall seconds per step. Prints each contestant's median step and ours / PyTorch for each pool.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time

import engine.bench.torch_first  # noqa: F401 - torch before our first product (engine/bench/torch_first.py)
from engine.bench.step import SETTLE
from engine.config import Config, replace
from engine.fast import blas, thread_pool

KEEP = 5  # timed steps per block, after SETTLE untimed ones
POLLING, SLEEPING = "ours polling", "ours sleeping"
POOLS = {POLLING: True, SLEEPING: False}  # thread_pool.SPIN of each of our contestants


@contextlib.contextmanager
def _workers(name: str):
    """The rank's pool rebuilt as contestant `name` has it (POOLS) inside the block."""
    n, before = thread_pool.threads(), thread_pool.SPIN
    thread_pool.set_threads(1)
    thread_pool.SPIN = POOLS[name]
    thread_pool.set_threads(n)
    try:
        yield
    finally:
        thread_pool.set_threads(1)
        thread_pool.SPIN = before
        thread_pool.set_threads(n)


def race(cfg: Config, steps: int = 15, warmup: int = 2, threads: int = 2) -> dict:
    """Median wall seconds per step of each contestant."""
    import torch

    from engine.bench.torch_peer import torch_adamw, torch_model_from, torch_train_step
    from engine.comm.base import Signals
    from engine.comm.cores import limited
    from engine.comm.threads import ThreadGroup
    from engine.trainer import Trainer
    torch.set_num_threads(threads)
    cfg = replace(replace(cfg, "train.steps", 10**6), "train.eval_every", 0)
    times: dict[str, list[float]] = {**{k: [] for k in POOLS}, "torch": [], "torch sdpa": []}
    with limited(threads):
        ours = Trainer(cfg, ThreadGroup(1, cfg.parallel.timeout_s, Signals()).communicator(0))
        twins = {k: torch_model_from(ours.model, fused_attention=k == "torch sdpa")
                 for k in ("torch", "torch sdpa")}
        opts = {k: torch_adamw(t, cfg.optim) for k, t in twins.items()}

        def block(name: str, n: int) -> list[float]:
            out = []
            with _workers(name) if name in POOLS else contextlib.nullcontext():
                for i in range(n):
                    t0 = time.perf_counter()
                    if name.startswith("ours"):
                        ours.train_step()
                    else:
                        x, y = ours.dataset.global_batch(i, "train")
                        torch_train_step(twins[name], opts[name], x, y, cfg.optim.grad_clip)
                    out.append(time.perf_counter() - t0)
            return out

        try:
            for name in times:
                block(name, warmup)
            r = 0
            while len(times["torch"]) < steps:
                for name in (list(times) if r % 2 == 0 else list(reversed(times))):
                    times[name] += block(name, SETTLE + KEEP)[SETTLE:]
                r += 1
        finally:
            ours.replica.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"median_s": med, "backend": blas.backend(), "threads": threads, "steps": len(times["torch"]),
            "ratios": {f"{o} / {p}": med[o] / med[p]
                       for o in POOLS for p in ("torch", "torch sdpa")},
            f"{POLLING} / {SLEEPING}": med[POLLING] / med[SLEEPING]}


def main(argv: list[str]) -> None:
    from engine.config.presets import load_preset
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    args = [a for i, a in enumerate(argv) if a != "--set" and (i == 0 or argv[i - 1] != "--set")]
    preset = args[0] if args else "gpt-mini"
    steps, threads = (int(args[1]) if len(args) > 1 else 15), (int(args[2]) if len(args) > 2 else 2)
    cfg = load_preset(preset, sets)[0]
    r = race(cfg, steps, threads=threads)
    print(f"{preset}: {r['steps']} timed steps each, {threads} thread(s), wall s, products on {r['backend']}")
    for name, s in r["median_s"].items():
        print(f"  {name:16s} {s * 1e3:8.1f} ms")
    for name, v in r["ratios"].items():
        print(f"  {name:28s} {v:.3f}")
    print(f"  {POLLING} / {SLEEPING}   {r[f'{POLLING} / {SLEEPING}']:.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
