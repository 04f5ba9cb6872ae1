"""`bench step --compare-precision`'s PyTorch side: its eager step in float32 and under bf16 autocast.

PyTorch's bf16 is autocast: float32 weights and optimizer, the forward's products cast to bfloat16 op by
op. Whether that pays depends on the CPU: with bfloat16 arithmetic in hardware (AVX512-BF16, AMX) oneDNN
runs the products in it; without, each cast and product is emulated and the step can be many times
slower than float32. nanoDist's bf16 computes in float32 between 16-bit storage on every CPU (NumPy's BLAS
has no bfloat16 product), so its cost against its own float32 barely moves. The two sides are timed the
same way, taking turns in blocks, so the ratios to each one's own float32 are fair on a noisy machine.
"""

from __future__ import annotations

import statistics
import time

from engine.config import Config

MODES = ("fp32", "bf16")
SETTLE = 1  # untimed steps after switching mode (the other mode's caches and spinning threads)


def race_torch_precisions(cfg: Config, model, dataset, threads: int, blocks: int = 2,
                          keep: int = 2) -> dict | None:
    """{mode: {step_s, vs_fp32}} of PyTorch eager on `model`'s shapes and initial weights (float32), with
    `keep` timed steps per block, `blocks` blocks each; None without PyTorch. Few steps: an emulated bf16
    step can take tens of seconds."""
    try:
        import torch
    except ImportError:
        return None
    from engine.bench.torch_peer import torch_adamw, torch_model_from, torch_train_step
    torch.set_num_threads(threads)
    twins = {m: torch_model_from(model) for m in MODES}
    opts = {m: torch_adamw(twin, cfg.optim) for m, twin in twins.items()}
    casts = {"fp32": None, "bf16": torch.bfloat16}
    times: dict[str, list[float]] = {m: [] for m in MODES}
    step = 0
    for _ in range(blocks):
        for mode in MODES:
            for i in range(SETTLE + keep):
                x, y = dataset.global_batch(step, "train")
                step += 1
                t0 = time.perf_counter()
                torch_train_step(twins[mode], opts[mode], x, y, cfg.optim.grad_clip, casts[mode])
                if i >= SETTLE:
                    times[mode].append(time.perf_counter() - t0)
    medians = {m: statistics.median(t) for m, t in times.items()}
    return {"torch": torch.__version__, "threads": threads,
            **{m: {"step_s": medians[m], "vs_fp32": medians[m] / medians["fp32"]} for m in MODES}}
