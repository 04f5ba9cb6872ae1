"""Mixture of experts and expert parallelism in the estimator: every rank's ledger to the byte. With every
expert local (dropless), every category's peak over the step, activations included (the router's and the
experts' arrays in place of the dense MLP's), over top-1/top-2, every block or every other, ZeRO 0-2 and
precisions. Under expert parallelism (e = 2, 4; ZeRO 0-2, the experts' state sharded over the ranks holding
the same experts; every precision) the model states at rest (the experts' parameters,
gradients and AdamW state 1/e of theirs) and every category but activations; the activations a rank's
experts keep depend on the rows the group sent it, and summed over each EP group they are e times the
estimate (the rows are conserved)."""

from __future__ import annotations

import math

import pytest

from engine.bench.memory import measure_rank
from engine.comm.launch import run_ranks
from engine.config import from_dict, to_dict
from engine.config.build import param_shapes
from engine.memory.estimator import estimate
from engine.memory.ledger import CATEGORIES, MODEL_STATES
from engine.parallel.mesh import Mesh

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


def _peaks(r) -> dict[str, int]:
    return {c: max(m[c] for m in r["maxima"].values()) for c in CATEGORIES}


# top_k, every, ZeRO, dtype
GRID = [(1, 1, 0, "fp32"), (2, 1, 1, "fp64"), (2, 2, 2, "bf16"), (1, 2, 0, "fp16")]


@pytest.mark.parametrize("top_k, every, stage, dtype", GRID)
def test_all_experts_local_estimate_equals_the_ledger(top_k, every, stage, dtype):
    cfg = tiny(model__top_k=top_k, model__moe_every=every, parallel__zero_stage=stage, precision__dtype=dtype)
    e = estimate(cfg)
    for r in measured(cfg):
        assert {k: r["at_rest"][k] for k in MODEL_STATES} == e.states, f"rank {r['rank']}"
        assert _peaks(r) == e.category_peaks(), f"rank {r['rank']}"


@pytest.mark.parametrize("expert, top_k, dtype, stage", [
    (2, 2, "fp32", 0), (4, 1, "fp64", 0), (4, 2, "fp32", 0), (2, 2, "bf16", 1), (2, 1, "fp16", 2),
    (4, 2, "fp32", 1), (2, 2, "fp64", 2)])
def test_expert_parallel_estimate_equals_the_ledger(expert, top_k, dtype, stage):
    cfg = tiny(parallel__expert=expert, model__top_k=top_k, precision__dtype=dtype,
               parallel__zero_stage=stage)
    e = estimate(cfg)
    ranks = measured(cfg)
    predicted = e.category_peaks()
    for r in ranks:
        assert {k: r["at_rest"][k] for k in MODEL_STATES} == e.states, f"rank {r['rank']}"
        assert {c: v for c, v in _peaks(r).items() if c != "activations"} == {
            c: v for c, v in predicted.items() if c != "activations"}, f"rank {r['rank']}"
    for group in Mesh.of(cfg.parallel).groups("ep"):
        assert sum(_peaks(ranks[r])["activations"] for r in group) == expert * predicted["activations"]
    if stage:
        return
    # the experts' parameters 1/e on each rank, everything else whole (counted here from the shapes)
    shapes = param_shapes(cfg, VOCAB)
    experts = sum(math.prod(s) for n, s, _ in shapes if ".experts." in n)
    rest = sum(math.prod(s) for n, s, _ in shapes if ".experts." not in n)
    assert e.states["parameters"] == (rest + experts // expert) * (8 if dtype == "fp64" else 4)
