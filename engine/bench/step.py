"""`bench step`: time our training step, and PyTorch eager on the same shapes in the same run.

Medians of `steps` timed steps after `warmup` untimed ones. Ours runs the real trainer (data,
forward, backward, gradient sync, clipping, AdamW) on every rank; PyTorch runs the equivalent
model with the same shapes, thread count and optimizer, on one process (it is the single-rank peer).
"""

from __future__ import annotations

import statistics
import time

from engine.comm.launch import run_ranks
from engine.config import Config, network_emulation, replace, to_dict


def _bench_rank(comm, emit, cfg_dict: dict, warmup: int, steps: int, should_stop=None) -> dict:
    from engine.config import from_dict
    from engine.trainer import Trainer
    cfg = from_dict(cfg_dict, source="<bench>")
    trainer = Trainer(cfg, comm)
    times, waits = [], []
    for i in range(warmup + steps):
        s = trainer.train_step()
        if i >= warmup:
            times.append(s["step_time_s"])
            waits.append(trainer.replica.comm_wait_s)
    return {"times": times, "waits": waits, "tokens": s["tokens"], "n_params": trainer.n_params}


def time_ours(cfg: Config, warmup: int = 5, steps: int = 20) -> dict:
    """Median step time (s) over ranks' medians, tokens per step, and the comm-wait share."""
    cfg = replace(replace(cfg, "train.steps", warmup + steps + 1), "train.eval_every", 0)
    results = run_ranks(cfg.parallel.world_size, cfg.parallel.backend, _bench_rank,
                        args=(to_dict(cfg), warmup, steps), timeout_s=cfg.parallel.timeout_s,
                        network=network_emulation(cfg),
                        threads_per_rank=cfg.parallel.threads_per_rank)
    step = max(statistics.median(r["times"]) for r in results)  # the slowest rank sets the pace
    wait = max(statistics.median(r["waits"]) for r in results)
    return {"step_s": step, "comm_wait_s": wait, "comm_share": wait / step if step else 0.0,
            "tokens": results[0]["tokens"], "n_params": results[0]["n_params"]}


SETTLE = 3  # steps after a switch of library that are not timed (see race_torch)


def race_torch(cfg: Config, warmup: int = 5, steps: int = 20, threads: int = 2) -> dict | None:
    """Our single-rank step and PyTorch eager's on the same model shapes, batches and optimizer,
    taking turns in this thread so both see the same machine load (these 2-core machines are noisy).
    None when PyTorch is not installed."""
    try:
        import torch  # noqa: F401 - only checking it is there
    except ImportError:
        return None
    from engine.comm.cores import limited
    with limited(threads):  # our pools (BLAS and engine.fast.kernels) the same size as PyTorch's
        return _race(cfg, warmup, steps, threads)


def _race(cfg: Config, warmup: int, steps: int, threads: int) -> dict:
    import torch

    from engine.bench.torch_peer import torch_adamw, torch_model_from, torch_train_step
    from engine.comm.base import Signals
    from engine.comm.threads import ThreadGroup
    from engine.trainer import Trainer
    torch.set_num_threads(threads)
    cfg = replace(replace(cfg, "train.steps", warmup + steps + 1), "train.eval_every", 0)
    ours = Trainer(cfg, ThreadGroup(1, cfg.parallel.timeout_s, Signals()).communicator(0))
    twin = torch_model_from(ours.model)
    opt = torch_adamw(twin, cfg.optim)

    def torch_step(i: int) -> float:
        t0 = time.perf_counter()
        x, y = ours.dataset.global_batch(i, "train")  # ours times its data draw too
        torch_train_step(twin, opt, x, y, cfg.optim.grad_clip)
        return time.perf_counter() - t0

    # Take turns in blocks, not single steps: each library's BLAS threads spin for a while after their
    # work, and the other's next steps run up to 4x slower until they stop (measured). So each block
    # drops its first SETTLE steps and keeps the rest.
    mine: list[float] = []
    theirs: list[float] = []
    keep = 5
    try:
        for i in range(warmup):
            ours.train_step()
            torch_step(i)
        while len(mine) < steps:
            mine.extend(ours.train_step()["step_time_s"] for _ in range(SETTLE + keep))
            del mine[-(SETTLE + keep):-keep]
            theirs.extend(torch_step(i) for i in range(SETTLE + keep))
            del theirs[-(SETTLE + keep):-keep]
    finally:
        ours.replica.close()
    return {"ours_s": statistics.median(mine), "step_s": statistics.median(theirs),
            "ratio": statistics.median(mine) / statistics.median(theirs),
            "torch": torch.__version__, "threads": threads}
