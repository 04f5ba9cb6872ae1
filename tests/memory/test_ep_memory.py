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

from engine.config.build import param_shapes
from engine.dtypes import itemsize
from engine.memory.estimator import estimate
from engine.memory.ledger import MODEL_STATES
from engine.parallel.mesh import Mesh
from tests.moe_memory_helpers import VOCAB, balanced_router, measured, peaks, tiny

__all__ = ["balanced_router"]  # the fixture, used by name

# top_k, every, ZeRO, dtype
GRID = [(1, 1, 0, "fp32"), (2, 1, 1, "fp64"), (2, 2, 2, "bf16"), (1, 2, 0, "fp16")]


@pytest.mark.parametrize("top_k, every, stage, dtype", GRID)
def test_all_experts_local_estimate_equals_the_ledger(top_k, every, stage, dtype):
    cfg = tiny(model__top_k=top_k, model__moe_every=every, parallel__zero_stage=stage, precision__dtype=dtype)
    e = estimate(cfg)
    for r in measured(cfg):
        assert {k: r["at_rest"][k] for k in MODEL_STATES} == e.states, f"rank {r['rank']}"
        assert peaks(r) == e.category_peaks(), f"rank {r['rank']}"


@pytest.mark.parametrize("expert, top_k, dtype, stage", [
    (2, 2, "fp32", 0), (4, 1, "fp64", 0), (4, 2, "fp32", 0), (2, 2, "bf16", 1), (2, 1, "fp16", 2),
    (4, 2, "fp32", 1), (2, 2, "fp64", 2)])
def test_expert_parallel_estimate_equals_the_ledger(expert, top_k, dtype, stage):
    cfg = tiny(parallel__expert=expert, model__top_k=top_k, precision__dtype=dtype,
               parallel__zero_stage=stage)
    e = estimate(cfg)
    ranks = measured(cfg)
    predicted = e.category_peaks()
    routed = ("activations", "comm_buffers")  # what depends on the rows the router sends each rank
    for r in ranks:
        assert {k: r["at_rest"][k] for k in MODEL_STATES} == e.states, f"rank {r['rank']}"
        assert {c: v for c, v in peaks(r).items() if c not in routed} == {
            c: v for c, v in predicted.items() if c not in routed}, f"rank {r['rank']}"
    for group in Mesh.of(cfg.parallel).groups("ep"):
        assert sum(peaks(ranks[r])["activations"] for r in group) == expert * predicted["activations"]
        # each exchange's rows sum to e·N·k over the group both ways, so the ranks' largest cannot sum lower
        assert sum(peaks(ranks[r])["comm_buffers"] for r in group) >= expert * predicted["comm_buffers"] > 0
    if stage:
        return
    # the experts' parameters 1/e on each rank, everything else whole (counted here from the shapes)
    shapes = param_shapes(cfg, VOCAB)
    experts = sum(math.prod(s) for n, s, _ in shapes if ".experts." in n)
    rest = sum(math.prod(s) for n, s, _ in shapes if ".experts." not in n)
    assert e.states["parameters"] == (rest + experts // expert) * (8 if dtype == "fp64" else 4)


# expert, top_k, capacity_factor, ZeRO, dtype
DISPATCH = [(2, 2, 0.0, 0, "fp32"), (4, 1, 0.0, 0, "fp64"), (4, 2, 0.0, 1, "bf16"), (2, 1, 0.5, 0, "fp32"),
            (2, 2, 0.75, 2, "fp32"), (4, 2, 0.5, 0, "fp16"), (2, 2, 0.0, 2, "fp64")]


@pytest.mark.parametrize("expert, top_k, capacity_factor, stage, dtype", DISPATCH)
def test_dispatch_buffers_equal_the_estimate_under_balanced_routing(balanced_router, expert, top_k,
                                                                    capacity_factor, stage, dtype):
    """Balanced routing, dropless or under a capacity that drops: every rank sends and receives
    min(N·k, E·capacity) rows per MoE layer, so its ledger equals the estimate in every category, phase by
    phase — the all-to-alls' send and receive buffers (comm_buffers), ZeRO-2's packs in flight beside them in
    backward, and the experts' and the combine's arrays (activations) included."""
    balanced_router[0] = top_k
    cfg = tiny(parallel__expert=expert, model__top_k=top_k, model__capacity_factor=capacity_factor,
               parallel__zero_stage=stage, precision__dtype=dtype)
    e = estimate(cfg)
    n, c = 2 * 8, 8  # tokens per rank (global batch 8 over 4 ranks, 8 each) and width
    rows = min(n * top_k, 4 * math.ceil(capacity_factor * n * top_k / 4)) if capacity_factor else n * top_k
    assert (rows < n * top_k) == (capacity_factor > 0)  # the capacities chosen drop
    buffers = 2 * rows * c * itemsize(dtype)  # one all-to-all's: the rows sent and the rows received
    assert e.category_peaks()["comm_buffers"] == buffers if stage < 2 else buffers <= e.category_peaks()[
        "comm_buffers"]
    for r in measured(cfg):
        assert peaks(r) == e.category_peaks(), f"rank {r['rank']}"
        assert r["maxima"] == e.maxima, f"rank {r['rank']}"
        assert r["peaks"] == e.by_phase, f"rank {r['rank']}"
