"""A mixture of experts beside tensor parallelism trains what one device trains (float64): TP 2 x DP 2 on 4
thread ranks, each expert's MLP column/row-split over the tensor group and the router whole (Megatron's
default: engine/parallel/expert/tensor.py), expert parallelism 1 and 2 (over the data-parallel pair of each
tensor rank), top-1 and top-2, dropless and under a capacity — the loss, gradient norm and first validation
loss of every step and the first step's gradients (shards joined by name) within 1e-12, every parameter
after 3 clipped AdamW steps within 1e-10; with sequence parallelism (the MoE on the whole sequence); with a
pipeline too (DP 2 x PP 2 x TP 2 on 8 ranks)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.comm.launch import run_ranks
from tests.moe_mesh_helpers import moe_config, one_device_config
from tests.pp_train_helpers import assert_trains_like, train_rank

STEPS = 3


def _one_device(world: int, m: int, pipeline: int = 1, tensor: int = 1, **over) -> dict:
    cfg = one_device_config(world, pipeline, m, tensor, **over)
    return run_ranks(1, "threads", train_rank, args=(cfg, STEPS), timeout_s=120)[0]


@pytest.mark.parametrize("top_k, capacity", [(2, 0.0), (1, 0.0), (2, 1.0)])
@pytest.mark.parametrize("expert", [1, 2])
def test_tensor_parallel_experts_equal_one_device(expert, top_k, capacity):
    over = dict(model__top_k=top_k, model__capacity_factor=capacity)
    cfg = moe_config(4, 1, 2, tensor=2, expert=expert, **over)
    ranks = run_ranks(4, "threads", train_rank, args=(cfg, STEPS), timeout_s=180)
    one = _one_device(4, 2, tensor=2, **over)
    if capacity:
        # an evaluation is one batch per data-parallel rank (no micro-batches): one device's capacity is
        # over both ranks' rows, so only the training steps are one device's; the ranks agree
        assert len({r["val"] for r in ranks}) == 1 and ranks[0]["val"] != one["val"]
        one = {**one, "val": ranks[0]["val"]}
    assert_trains_like(ranks, one)
    # each rank holds half of every expert's up-projection it holds (its rows) and of its down-projection
    up = np.asarray(ranks[0]["params"]["blocks.0.mlp.experts.mlps.0.layers.0.weight"])
    assert up.shape == (64, 16)  # joined: 4 x 16 features, each rank held 32


@pytest.mark.parametrize("expert, sp", [(1, False), (2, False), (2, True)])
def test_with_a_pipeline_too(expert, sp):
    cfg = moe_config(8, 2, 2, tensor=2, expert=expert, parallel__sequence_parallel=sp)
    ranks = run_ranks(8, "threads", train_rank, args=(cfg, STEPS), timeout_s=240)
    assert_trains_like(ranks, _one_device(8, 2, pipeline=2, tensor=2))


def _specs_rank(comm, emit, cfg_dict: dict) -> bool:
    from engine.config import from_dict
    from engine.config.build import build_model, mesh_groups, shard_model
    from engine.parallel.tensor import model_layout
    from engine.parallel.tensor.specs import shard_specs
    cfg = from_dict(cfg_dict)
    dense = build_model(cfg)
    names = [(n, p.shape) for n, p in dense.named_parameters()]
    live = model_layout(shard_model(dense, cfg, mesh_groups(cfg, comm))).specs
    return live == shard_specs("gpt", names, 2)


def test_the_names_alone_cut_the_experts_as_the_plan_does():
    """The estimator and checkpoints cut by names (engine.parallel.tensor.specs), the experts' cut too."""
    cfg = moe_config(2, 1, 1, tensor=2)
    assert run_ranks(2, "threads", _specs_rank, args=(cfg,), timeout_s=60) == [True, True]


@pytest.mark.parametrize("expert, capacity", [(1, 0.0), (2, 0.0), (2, 1.0)])
def test_sequence_parallelism_runs_the_experts_on_the_whole_sequence(expert, capacity):
    """TP 2 with sequence parallelism: ln_2's slices gathered into the MoE, its output sliced back out; the
    router and the experts' gradients whole on each rank (not summed over the group), ln_2's summed."""
    over = dict(model__capacity_factor=capacity)
    cfg = moe_config(4, 1, 2, tensor=2, expert=expert, parallel__sequence_parallel=True, **over)
    ranks = run_ranks(4, "threads", train_rank, args=(cfg, STEPS), timeout_s=180)
    one = _one_device(4, 2, tensor=2, **over)
    if capacity:  # the evaluation, one batch per data-parallel rank: see above
        one = {**one, "val": ranks[0]["val"]}
    assert_trains_like(ranks, one)


@pytest.mark.slow
def test_on_processes():
    """The experts' all-reduces beside the all-to-alls over a process transport: TP 2 x DP 2, EP 2, SP."""
    cfg = moe_config(4, 1, 2, tensor=2, expert=2, parallel__sequence_parallel=True)
    ranks = run_ranks(4, "processes", train_rank, args=(cfg, STEPS), timeout_s=240)
    assert_trains_like(ranks, _one_device(4, 2, tensor=2))


def _reports_rank(comm, emit, cfg_dict: dict) -> int:
    from engine.config import from_dict
    from engine.events import ExpertLoad
    from engine.trainer import Trainer
    trainer = Trainer(from_dict(cfg_dict), comm)
    try:
        figures = trainer._rank_figures(trainer.train_step())
        return sum(isinstance(e, ExpertLoad) for e in figures)
    finally:
        trainer.replica.close()


def test_a_tensor_group_reports_its_routing_once():
    """TP 2 x DP 2 (rank = tp + 2·dp): the TP ranks route the same tokens, so only tp 0 reports them."""
    cfg = moe_config(4, 1, 1, tensor=2, expert=2)
    assert run_ranks(4, "threads", _reports_rank, args=(cfg,), timeout_s=60) == [1, 0, 1, 0]
