"""A mixture of experts beside context parallelism trains what one device trains (float64): DP 2 x CP 2 on 4
thread ranks, each CP rank routing its own slice of every sequence (zigzag and contiguous), expert
parallelism 1, 2 and 4 (carved out of the data x context ranks), and CP 2 x TP 2 — the loss, gradient norm
and first validation loss of every step and the first step's gradients within 1e-12, every parameter after 3
clipped AdamW steps within 1e-10. The load-balancing shares are counted over the CP group (one all-reduce of E
integers per layer, metered): without it each rank balances its own slice, and training differs."""

from __future__ import annotations

import pytest

from engine.comm.launch import run_ranks
from tests.moe_mesh_helpers import moe_config, one_device_config
from tests.pp_train_helpers import assert_trains_like, train_rank

STEPS = 3
CP = dict(model__dropout=0.0, model__block_size=16)


def _one_device(world: int, context: int, m: int, tensor: int = 1, **over) -> dict:
    cfg = one_device_config(world, 1, m, tensor, context, **CP, **over)
    return run_ranks(1, "threads", train_rank, args=(cfg, STEPS), timeout_s=120)[0]


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("expert", [1, 2, 4])
def test_context_parallel_experts_equal_one_device(expert, layout):
    cfg = moe_config(4, 1, 2, context=2, expert=expert, parallel__context_layout=layout, **CP)
    ranks = run_ranks(4, "threads", train_rank, args=(cfg, STEPS), timeout_s=180)
    assert_trains_like(ranks, _one_device(4, 2, 2))


@pytest.mark.parametrize("layout, expert, top_k", [("zigzag", 2, 2), ("contiguous", 1, 2), ("zigzag", 4, 1)])
def test_a_capacity_drops_what_one_device_drops(layout, expert, top_k):
    """Capacity 0.5 (it drops): each expert keeps the first of the whole sequence's tokens, decided over the
    CP group's gathered choices. The evaluation is one batch per data-parallel rank (no micro-batches), so
    one device's capacity there is over both ranks' rows: only the training steps are one device's."""
    over = dict(model__capacity_factor=0.5, model__top_k=top_k)
    cfg = moe_config(4, 1, 2, context=2, expert=expert, parallel__context_layout=layout, **CP, **over)
    ranks = run_ranks(4, "threads", train_rank, args=(cfg, STEPS), timeout_s=180)
    one = _one_device(4, 2, 2, **over)
    assert len({r["val"] for r in ranks}) == 1
    assert_trains_like(ranks, {**one, "val": ranks[0]["val"]})


@pytest.mark.parametrize("expert", [1, 2])
def test_with_tensor_parallelism_too(expert):
    cfg = moe_config(4, 1, 2, tensor=2, context=2, expert=expert, **CP)
    ranks = run_ranks(4, "threads", train_rank, args=(cfg, STEPS), timeout_s=180)
    assert_trains_like(ranks, _one_device(4, 2, 2, tensor=2))


def test_the_shares_must_be_counted_over_the_group(monkeypatch):
    """Each rank balancing only its own slice trains something else: the counting is what makes it exact."""
    import engine.trainer
    monkeypatch.setattr(engine.trainer, "count_over_context", lambda model, group: model)
    cfg = moe_config(4, 1, 2, context=2, **CP)
    ranks = run_ranks(4, "threads", train_rank, args=(cfg, STEPS), timeout_s=180)
    with pytest.raises(AssertionError):
        assert_trains_like(ranks, _one_device(4, 2, 2))


@pytest.mark.slow
def test_on_processes():
    """The counts, the ring and the all-to-alls over a process transport: DP 2 x CP 2, EP 2, a capacity."""
    over = dict(model__capacity_factor=0.5)
    cfg = moe_config(4, 1, 2, context=2, expert=2, **CP, **over)
    ranks = run_ranks(4, "processes", train_rank, args=(cfg, STEPS), timeout_s=240)
    assert_trains_like(ranks, {**_one_device(4, 2, 2, **over), "val": ranks[0]["val"]})


@pytest.mark.parametrize("expert", [1, 2])
def test_inside_pipeline_stages_too(expert):
    """DP 2 x CP 2 x PP 2 on 8 ranks: each stage's MoE layers count their shares over the CP group."""
    cfg = moe_config(8, 2, 2, context=2, expert=expert, **CP)
    ranks = run_ranks(8, "threads", train_rank, args=(cfg, STEPS), timeout_s=240)
    one = run_ranks(1, "threads", train_rank, args=(one_device_config(8, 2, 2, 1, 2, **CP), STEPS),
                    timeout_s=120)[0]
    assert_trains_like(ranks, one)
