"""Tiny float64 configs and a rank function shared by the tests that train a context-parallel GPT through
the Trainer (tests/parallel/test_cp_train.py). Rank functions take only JSON arguments.

Shapes: context 8 (zigzag over 2 ranks: 4 chunks of 2 tokens; contiguous: 2 of 4), 4 heads of width 4 (a
tensor degree of 2 splits them), vocabulary 11, no dropout (context parallelism does not plan it).
"""

from __future__ import annotations

import numpy as np

from engine.config import from_dict, to_dict
from engine.trainer import Trainer


def cp_config(world: int = 1, context: int = 1, layout: str = "zigzag", tensor: int = 1, zero: int = 0,
              **over) -> dict:
    """A float64 GPT run of 3 steps, clipped in every step (grad_clip below the tiny model's norm)."""
    d = {
        "name": "cp-tiny", "seed": 7,
        "model": {"kind": "gpt", "n_layer": 2, "n_head": 4, "n_embd": 16, "block_size": 8, "dropout": 0.0,
                  "bias": True, "vocab_size": 11},
        "data": {"kind": "synthetic-lm", "n_samples": 256},
        "train": {"steps": 3, "global_batch": 4, "micro_batches": 1, "eval_every": 0, "eval_batches": 1},
        "optim": {"lr": 1e-2, "warmup_steps": 1, "grad_clip": 0.05},
        "parallel": {"world_size": world, "context": context, "context_layout": layout, "tensor": tensor,
                     "zero_stage": zero, "bucket_cap_mb": 0.002},
        "precision": {"dtype": "fp64"},
    }
    for key, value in over.items():
        section, name = key.split("__")
        d.setdefault(section, {})[name] = value
    return to_dict(from_dict(d))


def grad_rank(comm, emit, cfg_dict: dict) -> dict:
    """Rank function: the first step's loss on this rank and every parameter's gradient once the replica has
    reduced it (DDP, whole parameters: no tensor parallelism), before any update."""
    trainer = Trainer(from_dict(cfg_dict), comm)
    try:
        batch = trainer.dataset.global_batch(0, "train")
        trainer.replica.zero_grad()
        loss = trainer._accumulate(batch)
        trainer.replica.finish_backward()
        return {"loss": trainer._mean_over_ranks(loss)[0],
                "grads": {p.name: np.array(p.grad).tolist() for p in trainer.model.parameters()}}
    finally:
        trainer.replica.close()


def traffic_rank(comm, emit, cfg_dict: dict) -> dict:
    """Rank function: one training step; the bytes this rank sent by (group, phase); its blocks computed."""
    trainer = Trainer(from_dict(cfg_dict), comm)
    try:
        trainer.train_step()
        sent = {f"{row['group']} {row['phase']}": row["bytes_per_step"] for row in trainer.traffic.per_step()}
        return {"sent": sent, "blocks": trainer.context.ring.work["blocks"]}
    finally:
        trainer.replica.close()
