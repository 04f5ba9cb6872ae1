"""Tiny training configs and rank functions shared by the data-parallel tests (DDP, ZeRO, traffic, amp), and
the run of a by-hand file's entry point (data and tensor parallel).

Rank functions live in an importable module so the processes backend can run them too.
"""

from __future__ import annotations

import contextlib
import io
import runpy

from engine.comm.shard import shard_bounds
from engine.config import from_dict, to_dict
from engine.trainer import Trainer


def tiny_gpt(**over) -> dict:
    d = {
        "name": "tiny", "seed": 3,
        # No biases: the attention key bias has an exactly-zero true gradient (softmax ignores a constant
        # shift), so its computed gradient is rounding noise that Adam's normalisation turns into O(lr)
        # steps of random sign — no two summation orders agree on it, in any precision.
        "model": {"kind": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 16, "block_size": 8, "dropout": 0.0,
                  "bias": False},
        "data": {"kind": "synthetic-lm", "n_samples": 512},
        "train": {"steps": 10, "global_batch": 8, "micro_batches": 1, "eval_every": 0, "eval_batches": 1},
        "optim": {"lr": 1e-2, "warmup_steps": 2, "grad_clip": 1.0},
        "parallel": {"world_size": 1, "bucket_cap_mb": 0.002},  # tiny buckets: many of them
        "precision": {"dtype": "fp32"},
    }
    for key, value in over.items():
        section, name = key.split("__")
        d.setdefault(section, {})[name] = value
    d["model"]["vocab_size"] = 32
    return to_dict(from_dict(d))


def with_parallel(cfg: dict, world: int, stage: int, **extra) -> dict:
    return dict(cfg, parallel=dict(cfg["parallel"], world_size=world, zero_stage=stage, **extra))


def ring_bytes(n: int, world: int, rank: int) -> tuple[int, int]:
    """Elements rank sends in a ring reduce-scatter and all-gather of n elements (collectives.py)."""
    shard = [shard_bounds(n, world, r) for r in range(world)]
    size = [b - a for a, b in shard]
    return n - size[rank], n - size[(rank + 1) % world]


def gradient_group_lengths(comm, emit, cfg_dict):
    """Rank function: the lengths of the gradient groups the replica reduces (buckets; ZeRO-3: units)."""
    trainer = Trainer(from_dict(cfg_dict), comm)
    rep = trainer.replica
    ranges = [(0, u.flat.size) for u in rep.units] if hasattr(rep, "units") else rep.buckets
    lengths = [r[1] - r[0] for r in ranges]
    rep.close()
    return lengths


def by_hand_main(path: str, before_error: str) -> list[tuple[str, float]]:
    """Run a by-hand file as `python -m` runs it; for each line printed, its first word (the number of
    ranks) and the difference it reports, the number after `before_error`."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(path, run_name="__main__")
    return [(line.split()[0], float(line.split(before_error)[1].split()[0]))
            for line in out.getvalue().splitlines()]
