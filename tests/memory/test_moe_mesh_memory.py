"""Mixture of experts beside tensor (with and without sequence parallelism) and context parallelism, and
inside pipeline stages, in the estimator: every rank's ledger to the byte (4 thread ranks, the tiny MoE GPT
of tests/moe_memory_helpers.py). With every expert local: every category's peak. Under expert parallelism:
the model states at rest and every category but the routed ones (activations, comm buffers), which summed
over each EP group are e times the estimate; under balanced routing, every category exactly."""

from __future__ import annotations

import pytest

from engine.memory.estimator import estimate
from engine.memory.ledger import MODEL_STATES
from engine.memory.pipeline import estimate_ranks
from engine.parallel.mesh import Mesh
from tests.moe_memory_helpers import balanced_router, measured, peaks, tiny

__all__ = ["balanced_router"]  # the fixture, used by name

LAYOUTS = {"tp2": dict(parallel__tensor=2),
           "tp2-sp": dict(parallel__tensor=2, parallel__sequence_parallel=True),
           "cp2": dict(parallel__context=2),
           "cp2-tp2": dict(parallel__context=2, parallel__tensor=2)}
ROUTED = ("activations", "comm_buffers")


@pytest.mark.parametrize("top_k", [1, 2])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_expert_local(layout, top_k):
    cfg = tiny(model__top_k=top_k, **LAYOUTS[layout])
    e = estimate(cfg)
    for r in measured(cfg):
        assert {k: r["at_rest"][k] for k in MODEL_STATES} == e.states, f"rank {r['rank']}"
        assert peaks(r) == e.category_peaks(), f"rank {r['rank']}"


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_split_experts(layout):
    cfg = tiny(parallel__expert=2, **LAYOUTS[layout])
    e = estimate(cfg)
    ranks = measured(cfg)
    predicted = e.category_peaks()
    for r in ranks:
        assert {k: r["at_rest"][k] for k in MODEL_STATES} == e.states, f"rank {r['rank']}"
        assert {c: v for c, v in peaks(r).items() if c not in ROUTED} == {
            c: v for c, v in predicted.items() if c not in ROUTED}, f"rank {r['rank']}"
    for group in Mesh.of(cfg.parallel).groups("ep"):
        assert sum(peaks(ranks[r])["activations"] for r in group) == 2 * predicted["activations"]


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_split_experts_under_balanced_routing(balanced_router, layout):
    balanced_router[0] = 2
    cfg = tiny(parallel__expert=2, **LAYOUTS[layout])
    e = estimate(cfg)
    for r in measured(cfg):
        assert peaks(r) == e.category_peaks(), f"rank {r['rank']}"
        assert r["peaks"] == e.by_phase, f"rank {r['rank']}"


PIPELINES = {"pp2": dict(parallel__pipeline=2), "pp2-m2": dict(parallel__pipeline=2, train__micro_batches=2),
             "pp2-gpipe-m2": dict(parallel__pipeline=2, parallel__schedule="gpipe", train__micro_batches=2),
             "pp2-tp2": dict(parallel__pipeline=2, parallel__tensor=2, parallel__world_size=4),
             "pp2-tp2-sp": dict(parallel__pipeline=2, parallel__tensor=2, parallel__sequence_parallel=True),
             "pp2-cp2": dict(parallel__pipeline=2, parallel__context=2, model__block_size=16)}


def _by_pipeline_rank(cfg, ranks):
    """Each rank's measurement beside its pipeline rank's estimate (estimate_ranks: they differ by stage)."""
    estimates, mesh = estimate_ranks(cfg), Mesh.of(cfg.parallel)
    return [(r, estimates[mesh.coords(r["rank"]).pp]) for r in ranks]


@pytest.mark.parametrize("top_k", [1, 2])
@pytest.mark.parametrize("layout", list(PIPELINES))
def test_pipeline_stages_every_expert_local(layout, top_k):
    cfg = tiny(model__top_k=top_k, **PIPELINES[layout])
    for r, e in _by_pipeline_rank(cfg, measured(cfg)):
        assert {k: r["at_rest"][k] for k in MODEL_STATES} == e.states, f"rank {r['rank']}"
        assert peaks(r) == e.category_peaks(), f"rank {r['rank']}"


@pytest.mark.parametrize("layout", ["pp2", "pp2-m2", "pp2-gpipe-m2", "pp2-cp2"])
def test_pipeline_stages_split_experts_under_balanced_routing(balanced_router, layout):
    balanced_router[0] = 2
    cfg = tiny(parallel__expert=2, **PIPELINES[layout])
    for r, e in _by_pipeline_rank(cfg, measured(cfg)):
        assert {k: r["at_rest"][k] for k in MODEL_STATES} == e.states, f"rank {r['rank']}"
        assert peaks(r) == e.category_peaks(), f"rank {r['rank']}"


def test_a_capacity_beside_context_parallelism_is_bounded():
    """A capacity is decided over the whole sequence: which slice's tokens it drops depends on the routing, so
    the estimate takes every choice kept (n·k rows a rank); the ledger stays within it, all else exact."""
    cfg = tiny(parallel__context=2, model__capacity_factor=0.5)
    e = estimate(cfg)
    predicted = e.category_peaks()
    for r in measured(cfg):
        assert {k: r["at_rest"][k] for k in MODEL_STATES} == e.states, f"rank {r['rank']}"
        assert {c: v for c, v in peaks(r).items() if c not in ROUTED} == {
            c: v for c, v in predicted.items() if c not in ROUTED}, f"rank {r['rank']}"
        assert peaks(r)["activations"] <= predicted["activations"]
