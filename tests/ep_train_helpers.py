"""The tiny float64 mixture-of-experts run the expert-parallel training tests share
(tests/parallel/test_ep_*.py): 4 thread ranks of data parallelism, 2 blocks of width 8, 4 experts in each,
3 clipped AdamW steps."""

from __future__ import annotations

from engine.config import from_dict, to_dict

STEPS, RTOL = 3, 1e-10


def moe_config(expert: int, top_k: int, capacity_factor: float = 0.0, micro_batches: int = 1) -> dict:
    d = {
        "name": "moe-tiny", "seed": 5,
        "model": {"kind": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 8, "block_size": 8, "vocab_size": 11,
                  "n_experts": 4, "top_k": top_k, "moe_every": 1, "capacity_factor": capacity_factor,
                  "aux_loss_coef": 0.1},
        "data": {"kind": "synthetic-lm", "n_samples": 256},
        "train": {"steps": STEPS, "global_batch": 8, "micro_batches": micro_batches, "eval_every": 0,
                  "eval_batches": 1},
        "optim": {"lr": 1e-2, "warmup_steps": 1, "grad_clip": 0.05},
        "parallel": {"world_size": 4, "expert": expert, "bucket_cap_mb": 0.002},
        "precision": {"dtype": "fp64"},
    }
    return to_dict(from_dict(d))
