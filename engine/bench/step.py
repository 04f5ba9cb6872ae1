"""`bench step`: time our training step, and PyTorch eager on the same shapes in the same run.

Medians of `steps` timed steps after `warmup` untimed ones. Ours runs the real trainer (data,
forward, backward, gradient sync, clipping, AdamW) on every rank; PyTorch runs the equivalent
model with the same shapes, thread count and optimizer, on one process (it is the single-rank peer),
twice for a GPT: with attention written out as nanoDist computes it (QKᵀ, mask, softmax, PV) and with
`scaled_dot_product_attention`, PyTorch's fused kernel.

A step's FLOPs are the projection's count (engine.projection.flops, FLOPS_CONVENTION below), so
GFLOP/s against engine.bench.machine's measured float32 peak says what fraction of the machine a step uses.
"""

from __future__ import annotations

import statistics
import time

import engine.bench.torch_first  # noqa: F401 - torch before our first product (engine/bench/torch_first.py)
from engine.comm.launch import run_ranks
from engine.config import Config, network_emulation, replace, to_dict

FLOPS_CONVENTION = ("3 x forward; forward: 2 per weight per token (blocks, head; embedding lookups 0) "
                    "+ 4·T·C per token per layer (QKᵀ and PV, the full T x T square)")


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
    return {"times": times, "waits": waits, "tokens": s["tokens"], "n_params": trainer.n_params,
            "vocab": getattr(trainer.model, "config", {}).get("vocab_size", 0)}


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
            "tokens": results[0]["tokens"], "n_params": results[0]["n_params"], "vocab": results[0]["vocab"]}


def step_flops(cfg: Config, vocab: int) -> float:
    """Training FLOPs of one optimizer step over all ranks and micro-batches (FLOPS_CONVENTION)."""
    from engine.projection.flops import model_flops
    return model_flops(cfg, vocab, cfg.train.global_batch).training


def rate(flops: float, step_s: float, peak_gflops: float) -> dict:
    """A step's GFLOP/s and its fraction of the measured peak."""
    gflops = flops / step_s / 1e9
    return {"gflops": gflops, "of_peak": gflops / peak_gflops}


def moe_unraced(cfg: Config) -> str | None:
    """Why no PyTorch peer races cfg: a mixture-of-experts GPT's only twin is the expert-parallel one
    (engine/bench/moe_peer.py, processes backend, parallel.expert > 1); the others are dense. None for a
    dense model."""
    if cfg.model.kind == "gpt" and cfg.model.n_experts:
        return ("a mixture-of-experts GPT (model.n_experts > 0) is raced only under expert parallelism on "
                "processes (parallel.expert > 1, -b processes): PyTorch's other twins are dense")
    return None


SETTLE = 3  # steps after a switch of library that are not timed (see race_torch)


def race_torch(cfg: Config, warmup: int = 5, steps: int = 20, threads: int = 2) -> dict | None:
    """Our single-rank step and PyTorch eager's on the same model shapes, batches and optimizer,
    taking turns in this thread so all see the same machine load (these 2-core machines are noisy).
    step_s and ratio are PyTorch with hand-written attention (nanoDist's algorithm); "sdpa" holds the
    same with scaled_dot_product_attention (None for an MLP). None when PyTorch is not installed."""
    try:
        import torch  # noqa: F401 - only checking it is there
    except ImportError:
        return None
    from engine.comm.cores import limited
    with limited(threads):  # our pools (BLAS and engine.fast.kernels) the same size as PyTorch's
        return _race(cfg, warmup, steps, threads)


def _race(cfg: Config, warmup: int, steps: int, threads: int) -> dict:
    import torch

    from engine import nn
    from engine.bench.torch_peer import torch_adamw, torch_model_from, torch_train_step
    from engine.comm.base import Signals
    from engine.comm.threads import ThreadGroup
    from engine.trainer import Trainer
    torch.set_num_threads(threads)
    cfg = replace(replace(cfg, "train.steps", warmup + steps + 1), "train.eval_every", 0)
    ours = Trainer(cfg, ThreadGroup(1, cfg.parallel.timeout_s, Signals()).communicator(0))
    # both twins start from our initial weights; an MLP has no attention, so one twin
    kinds = ("manual", "sdpa") if isinstance(ours.model, nn.GPT) else ("manual",)
    twins = {k: torch_model_from(ours.model, fused_attention=k == "sdpa") for k in kinds}
    opts = {k: torch_adamw(twin, cfg.optim) for k, twin in twins.items()}

    def torch_step(kind: str, i: int) -> float:
        t0 = time.perf_counter()
        x, y = ours.dataset.global_batch(i, "train")  # ours times its data draw too
        torch_train_step(twins[kind], opts[kind], x, y, cfg.optim.grad_clip)
        return time.perf_counter() - t0

    # Take turns in blocks, not single steps: each library's BLAS threads spin for a while after their
    # work, and the other's next steps run up to 4x slower until they stop (measured). So each block
    # drops its first SETTLE steps and keeps the rest.
    mine: list[float] = []
    theirs: dict[str, list[float]] = {k: [] for k in kinds}
    keep = 5
    try:
        for i in range(warmup):
            ours.train_step()
            for k in kinds:
                torch_step(k, i)
        while len(mine) < steps:
            mine.extend(ours.train_step()["step_time_s"] for _ in range(SETTLE + keep))
            del mine[-(SETTLE + keep):-keep]
            for k in kinds:
                theirs[k].extend(torch_step(k, i) for i in range(SETTLE + keep))
                del theirs[k][-(SETTLE + keep):-keep]
    finally:
        ours.replica.close()
    ours_s = statistics.median(mine)
    manual = statistics.median(theirs["manual"])
    sdpa = statistics.median(theirs["sdpa"]) if "sdpa" in theirs else None
    return {"ours_s": ours_s, "step_s": manual, "ratio": ours_s / manual,
            "sdpa": None if sdpa is None else {"step_s": sdpa, "ratio": ours_s / sdpa},
            "torch": torch.__version__, "threads": threads}
