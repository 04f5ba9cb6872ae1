"""Shared by the mixture-of-experts memory tests (tests/memory/test_ep_memory.py, test_moe_mesh_memory.py): a
tiny MoE GPT on 4 ranks, its ledger measured on thread ranks, each category's peak, and a router forced to
balanced routing."""

from __future__ import annotations

import numpy as np
import pytest

from engine import moe
from engine.bench.memory import measure_rank
from engine.comm.launch import run_ranks
from engine.config import from_dict, to_dict
from engine.memory.ledger import CATEGORIES
from engine.tensor import Tensor

VOCAB = 13


def tiny(**over):
    d = {"name": "moe-est", "seed": 1,
         "model": {"kind": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 8, "block_size": 8,
                   "vocab_size": VOCAB, "n_experts": 4, "top_k": 2},
         "data": {"kind": "synthetic-lm", "n_samples": 128},
         "train": {"steps": 1, "global_batch": 8, "micro_batches": 1, "eval_every": 0, "eval_batches": 1},
         "parallel": {"bucket_cap_mb": 0.004, "world_size": 4},
         "precision": {"init_scale": 256.0}}
    for key, value in over.items():
        section, name = key.split("__")
        d.setdefault(section, {})[name] = value
    return from_dict(d)


def measured(cfg):
    return run_ranks(cfg.parallel.world_size, "threads", measure_rank, args=(to_dict(cfg), 1), timeout_s=60)


def peaks(r) -> dict[str, int]:
    return {c: max(m[c] for m in r["maxima"].values()) for c in CATEGORIES}


@pytest.fixture
def balanced_router(monkeypatch):
    """Every rank's tokens choose each expert equally often: token n's k choices are experts n·k, ..., n·k + k
    - 1 (mod E), in that order, forced by a constant added to the router's logits (no gradient; the router's
    own code then picks, renormalises, drops and saves as ever)."""
    plain = moe.softmax

    def softmax(logits):
        n, e = logits.shape
        k = e_top_k[0]
        bias = np.zeros((n, e), logits.dtype)
        for j in range(k):
            bias[np.arange(n), (np.arange(n) * k + j) % e] = 64.0 - j
        return plain(logits + Tensor(bias))
    e_top_k = [1]
    monkeypatch.setattr(moe, "softmax", softmax)
    return e_top_k
