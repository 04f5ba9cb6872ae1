"""`bench step`: time our training step, and PyTorch eager on the same shapes in the same run.

Medians of `steps` timed steps after `warmup` untimed ones. Ours runs the real trainer (data,
forward, backward, gradient sync, clipping, AdamW) on every rank; PyTorch runs the equivalent
model with the same shapes, thread count and optimizer, on one process (it is the single-rank peer).
"""

from __future__ import annotations

import statistics
import time

from engine.comm.launch import run_ranks
from engine.config import Config, replace, to_dict


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
                        args=(to_dict(cfg), warmup, steps), timeout_s=cfg.parallel.timeout_s)
    step = max(statistics.median(r["times"]) for r in results)  # the slowest rank sets the pace
    wait = max(statistics.median(r["waits"]) for r in results)
    return {"step_s": step, "comm_wait_s": wait, "comm_share": wait / step if step else 0.0,
            "tokens": results[0]["tokens"], "n_params": results[0]["n_params"]}


def time_torch(cfg: Config, warmup: int = 5, steps: int = 20, threads: int = 2) -> dict | None:
    """PyTorch eager on the same model shapes and batch (None when PyTorch is not installed)."""
    try:
        import torch
    except ImportError:
        return None
    from engine.build import build_dataset, build_model
    from engine.torch_peer import torch_model_from
    torch.set_num_threads(threads)
    dataset = build_dataset(cfg)
    model = torch_model_from(build_model(cfg, dataset))
    o = cfg.optim
    opt = torch.optim.AdamW(model.parameters(), lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps,
                            weight_decay=o.weight_decay)
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        x, y = dataset.global_batch(i, "train")  # ours times its data draw too
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)
        logits = model(xt)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), yt.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if o.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip)
        opt.step()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return {"step_s": statistics.median(times), "torch": torch.__version__, "threads": threads}
