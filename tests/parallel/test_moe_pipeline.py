"""Mixture-of-experts blocks inside pipeline stages train what one device trains (float64): DP 2 x PP 2 on 4
thread ranks, expert parallelism 1 and 2 (over each stage's two data-parallel ranks), dropout on — the loss,
gradient norm and first validation loss of every step, the first step's gradients after the reduce within
1e-12 (each expert's from the ranks that hold it), every parameter after 3 clipped AdamW steps within 1e-10.
Each stage's load-balancing terms reach the objective (a run whose terms were left out of the stages'
backward differs from one device); each rank reports the MoE layers of its own stage."""

from __future__ import annotations

import pytest

from engine.comm.launch import run_ranks
from tests.moe_mesh_helpers import moe_config, one_device_config
from tests.pp_train_helpers import assert_trains_like, train_rank

STEPS = 3


def _one_device(world: int, pipeline: int, m: int, **over) -> dict:
    cfg = one_device_config(world, pipeline, m, **over)
    return run_ranks(1, "threads", train_rank, args=(cfg, STEPS), timeout_s=120)[0]


@pytest.mark.parametrize("schedule, chunks", [("1f1b", 1), ("zb-h1", 1), ("interleaved", 2)])
@pytest.mark.parametrize("expert", [1, 2])
def test_pipeline_with_experts_equals_one_device(expert, schedule, chunks):
    over = dict(parallel__schedule=schedule, parallel__chunks=chunks, model__n_layer=4)
    cfg = moe_config(4, 2, 2, expert=expert, **over)
    ranks = run_ranks(4, "threads", train_rank, args=(cfg, STEPS), timeout_s=180)
    assert_trains_like(ranks, _one_device(4, 2, 2, model__n_layer=4))


def _loads_rank(comm, emit, cfg_dict: dict) -> list[list[int]]:
    from engine.config import from_dict
    from engine.moe_stats import expert_load
    from engine.trainer import Trainer
    trainer = Trainer(from_dict(cfg_dict), comm)
    try:
        trainer.train_step()
        (load,) = expert_load(trainer.model, 1, comm.rank)
        return [load.blocks, [sum(t) for t in load.tokens_per_expert]]
    finally:
        trainer.replica.close()


def test_each_rank_reports_its_stage_layers():
    """Stage 0 holds blocks 0-1, stage 1 blocks 2-3 (by parameters: the tied head weighs as the embedding):
    each rank's ExpertLoad names its own blocks, and their tokens are its micro-batches' (2 x 2 rows of 8
    tokens, top-2)."""
    cfg = moe_config(4, 2, 2, expert=2)
    loads = run_ranks(4, "threads", _loads_rank, args=(cfg,), timeout_s=120)
    assert [blocks for blocks, _ in loads] == [[0, 1], [0, 1], [2, 3], [2, 3]]  # rank = dp + 2·pp
    assert all(tokens == [2 * 2 * 8 * 2] * 2 for _, tokens in loads)


@pytest.mark.slow
def test_on_processes():
    """The stages' activations and the all-to-alls over a process transport: DP 2 x PP 2, EP 2."""
    cfg = moe_config(4, 2, 2, expert=2)
    ranks = run_ranks(4, "processes", train_rank, args=(cfg, STEPS), timeout_s=240)
    assert_trains_like(ranks, _one_device(4, 2, 2))
