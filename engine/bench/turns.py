"""Our training step in several settings and PyTorch's two twins (hand-written attention and
scaled_dot_product_attention), taking turns in blocks of steps in one process, the order reversed every
round: ratios taken under the same machine load. The races in engine.bench.blas_race and
engine.bench.pool_race name our settings; this module runs them and prints what they measured.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager

from engine.bench.step import SETTLE
from engine.config import Config, replace

KEEP = 5  # timed steps per block, after SETTLE untimed ones
TWINS = ("torch", "torch sdpa")


def race_in_turns(cfg: Config, ours: Mapping[str, Callable[[], AbstractContextManager]], steps: int,
                  warmup: int, threads: int, clock: Callable[[], float] = time.perf_counter) -> dict:
    """Median seconds per step of each of our settings (`ours`: name -> the context a block of our steps
    runs in) and of PyTorch's twins, on `threads` threads; `clock` times each step."""
    import torch

    from engine.bench.torch_peer import torch_adamw, torch_model_from, torch_train_step
    from engine.comm.base import Signals
    from engine.comm.cores import limited
    from engine.comm.threads import ThreadGroup
    from engine.trainer import Trainer
    torch.set_num_threads(threads)
    cfg = replace(replace(cfg, "train.steps", 10**6), "train.eval_every", 0)
    times: dict[str, list[float]] = {**{k: [] for k in ours}, **{k: [] for k in TWINS}}
    with limited(threads):
        trainer = Trainer(cfg, ThreadGroup(1, cfg.parallel.timeout_s, Signals()).communicator(0))
        twins = {k: torch_model_from(trainer.model, fused_attention=k == "torch sdpa") for k in TWINS}
        opts = {k: torch_adamw(t, cfg.optim) for k, t in twins.items()}

        def block(name: str, n: int) -> list[float]:
            out = []
            if name in ours:
                with ours[name]():
                    for _ in range(n):
                        t0 = clock()
                        trainer.train_step()
                        out.append(clock() - t0)
                return out
            for i in range(n):
                t0 = clock()
                x, y = trainer.dataset.global_batch(i, "train")
                torch_train_step(twins[name], opts[name], x, y, cfg.optim.grad_clip)
                out.append(clock() - t0)
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
            trainer.replica.close()
    return {k: statistics.median(v) for k, v in times.items()} | {"steps": len(times["torch"])}


def race_arguments(argv: list[str], default_preset: str) -> tuple[str, Config, int, int]:
    """`[preset] [steps] [threads] [--set key=value ...]` as (preset, config, steps, threads)."""
    from engine.config.presets import load_preset
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    args = [a for i, a in enumerate(argv) if a != "--set" and (i == 0 or argv[i - 1] != "--set")]
    preset = args[0] if args else default_preset
    steps, threads = (int(args[1]) if len(args) > 1 else 15), (int(args[2]) if len(args) > 2 else 2)
    return preset, load_preset(preset, sets)[0], steps, threads


def print_race(r: dict) -> None:
    """Each contestant's median step, then ours / PyTorch for each of our settings."""
    for name, s in r["median_s"].items():
        print(f"  {name:16s} {s * 1e3:8.1f} ms")
    for name, v in r["ratios"].items():
        print(f"  {name:28s} {v:.3f}")
