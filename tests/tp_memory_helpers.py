"""A tiny GPT config for the memory tests of split models (tensor and context parallelism), and its ledger
measured on thread ranks (engine.bench.memory.measure_rank), to set against the estimator."""

from __future__ import annotations

from engine.bench.memory import measure_rank
from engine.comm.launch import run_ranks
from engine.config import from_dict, to_dict

VOCAB = 23  # no t in {2, 4} divides it: the shards are padded


def tiny(**over):
    d = {"name": "tp-est", "seed": 1,
         "model": {"kind": "gpt", "n_layer": 3, "n_head": 4, "n_embd": 16, "block_size": 8,
                   "vocab_size": VOCAB},
         "data": {"kind": "synthetic-lm", "n_samples": 128},
         "train": {"steps": 2, "global_batch": 4, "micro_batches": 1, "eval_every": 0, "eval_batches": 1},
         "parallel": {"bucket_cap_mb": 0.004},
         "precision": {"init_scale": 256.0}}  # fp16: no overflowing first steps
    for key, value in over.items():
        section, name = key.split("__")
        d.setdefault(section, {})[name] = value
    return from_dict(d)


def measured(cfg):
    return run_ranks(cfg.parallel.world_size, "threads", measure_rank, args=(to_dict(cfg), 2), timeout_s=60)
