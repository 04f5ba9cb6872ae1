"""`bench step --cpu-time`: CPU seconds per training step on one thread, ours at fp32/fp16/bf16 and
PyTorch eager at fp32, taking turns in this thread.

Why: wall-clock ratios on a shared machine swing with other people's load (a 2-thread step loses most
when a core is taken away). CPU time of one thread (BLAS, engine.fast.thread_pool and PyTorch all limited to
one thread) counts only the work this process did, so the ratios hold under load; they compare one core
against one core. `time.process_time` counts every thread of the process, which is the one working
thread here. Each block of steps starts with one untimed step after a switch.
"""

from __future__ import annotations

import statistics
import time

from engine.config import Config, replace

DTYPES = ("fp32", "fp16", "bf16")
SETTLE, KEEP = 1, 4  # per block: untimed steps after a switch, timed steps


def cpu_time_race(cfg: Config, warmup: int = 3, steps: int = 12, torch_peer: bool = True) -> dict:
    """{"fp32"|"fp16"|"bf16": {cpu_s, vs_fp32}, "torch": {cpu_s, version} or None, "ratio": fp32
    ours/PyTorch or None} for one rank of `cfg`, every pool limited to one thread."""
    from engine.comm.base import Signals
    from engine.comm.cores import limited
    from engine.comm.threads import ThreadGroup
    from engine.trainer import Trainer
    cfg = replace(replace(replace(cfg, "train.steps", 10 * (warmup + steps) + 1), "train.eval_every", 0),
                  "parallel.world_size", 1)
    with limited(1):
        trainers = {d: Trainer(replace(cfg, "precision.dtype", d),
                               ThreadGroup(1, cfg.parallel.timeout_s, Signals()).communicator(0))
                    for d in DTYPES}
        runners = {d: _timed(t.train_step) for d, t in trainers.items()}
        peer = _torch_runner(trainers["fp32"], cfg) if torch_peer else None
        if peer is not None:
            runners["torch"] = peer[0]
        times: dict[str, list[float]] = {d: [] for d in runners}
        try:
            for run in runners.values():
                for _ in range(warmup):
                    run()
            while len(times["fp32"]) < steps:
                for d, run in runners.items():
                    times[d] += [run() for _ in range(SETTLE + KEEP)][SETTLE:]
        finally:
            for trainer in trainers.values():
                trainer.replica.close()
    cpu = {d: statistics.median(t) for d, t in times.items()}
    report: dict = {d: {"cpu_s": cpu[d], "vs_fp32": cpu[d] / cpu["fp32"]} for d in DTYPES}
    report["torch"] = {"cpu_s": cpu["torch"], "version": peer[1]} if peer else None
    report["ratio"] = cpu["fp32"] / cpu["torch"] if peer else None
    return report


def _timed(fn):
    def run() -> float:
        t0 = time.process_time()
        fn()
        return time.process_time() - t0
    return run


def _torch_runner(ours, cfg: Config):
    """(a timed PyTorch step on the twin of `ours`, torch's version), or None without PyTorch."""
    try:
        import torch
    except ImportError:
        return None
    from engine.bench.torch_peer import torch_adamw, torch_model_from, torch_train_step
    torch.set_num_threads(1)
    twin = torch_model_from(ours.model)
    opt = torch_adamw(twin, cfg.optim)
    step = iter(range(1 << 30))

    def torch_step() -> None:
        x, y = ours.dataset.global_batch(next(step), "train")  # ours draws its batch inside its step too
        torch_train_step(twin, opt, x, y, cfg.optim.grad_clip)
    return _timed(torch_step), torch.__version__
