"""`bench step --compare-precision`: the step at fp32, fp16 and bf16 on one rank, taking turns.

The three trainers (same model shapes, batches and optimizer; 16-bit ones with their fp32 master
weights and, for fp16, the preset's loss scaling) live in this thread and take turns in blocks of
steps, so all three see the same machine load and the ratios to fp32 are fair on a noisy machine;
each block's first step is not timed. Steps an fp16 overflow skips (no update) are reported.
PyTorch's eager step in float32 and under bf16 autocast follows when PyTorch is installed
(engine.bench.torch_precision).
"""

from __future__ import annotations

import statistics

from engine.config import Config, replace

DTYPES = ("fp32", "fp16", "bf16")
SETTLE, KEEP = 1, 4  # per block: untimed steps after a switch, timed steps


def race_precisions(cfg: Config, warmup: int = 3, steps: int = 12) -> dict:
    """{dtype: {step_s, vs_fp32, skipped}} for one rank of `cfg` in each precision."""
    from engine.bench.torch_precision import race_torch_precisions
    from engine.comm.base import Signals
    from engine.comm.cores import limited, resolve, usable_cores
    from engine.comm.threads import ThreadGroup
    from engine.trainer import Trainer
    cfg = replace(replace(replace(cfg, "train.steps", 10 * (warmup + steps) + 1), "train.eval_every", 0),
                  "parallel.world_size", 1)
    threads = resolve(cfg.parallel.threads_per_rank, len(usable_cores()), 1)
    with limited(threads):
        trainers = {d: Trainer(replace(cfg, "precision.dtype", d),
                               ThreadGroup(1, cfg.parallel.timeout_s, Signals()).communicator(0))
                    for d in DTYPES}
        times: dict[str, list[float]] = {d: [] for d in DTYPES}
        skipped = dict.fromkeys(DTYPES, 0)
        try:
            for trainer in trainers.values():
                for _ in range(warmup):
                    trainer.train_step()
            while len(times["fp32"]) < steps:
                for d, trainer in trainers.items():
                    block = [trainer.train_step() for _ in range(SETTLE + KEEP)][SETTLE:]
                    times[d] += [s["step_time_s"] for s in block]
                    skipped[d] += sum(s["skipped"] for s in block)
            torch_side = race_torch_precisions(cfg, trainers["fp32"].model, trainers["fp32"].dataset, threads)
        finally:
            for trainer in trainers.values():
                trainer.replica.close()
    medians = {d: statistics.median(t) for d, t in times.items()}
    return {"threads": threads, "torch": torch_side,
            **{d: {"step_s": medians[d], "vs_fp32": medians[d] / medians["fp32"], "skipped": skipped[d]}
               for d in DTYPES}}
