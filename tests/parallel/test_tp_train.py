"""The Trainer with tensor parallelism trains what one device trains (float64): t in {2, 4} and DP 2 x TP 2
under ZeRO 0-3, each with and without sequence parallelism — the loss and the gradient norm of every step
and every parameter after 3 clipped AdamW steps within 1e-10 of a one-device Trainer's on the same global
batch, dropout on; with gradient accumulation and activation checkpointing; on threads and on processes.
fp16 and bf16 within their rounding. The replicated parameters (LayerNorms, whose gradients SP sums over the
group) stay bitwise equal across the TP group; an fp16 overflow on one rank's shard is skipped by every rank
of the mesh."""

from __future__ import annotations

import numpy as np
import pytest

from engine.comm.launch import run_ranks
from tests.tp_train_helpers import assert_trains_like, digest_rank, overflow_rank, tp_config, train_rank

STEPS = 3


def _one_device(**over) -> dict:
    return run_ranks(1, "threads", train_rank, args=(tp_config(**over), STEPS), timeout_s=60)[0]


LAYOUTS = [(2, 2, 0), (4, 4, 0)] + [(4, 2, zero) for zero in range(4)]  # (world, tensor, ZeRO stage)


@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sp"])
@pytest.mark.parametrize("world, t, zero", LAYOUTS, ids=[f"dp{w // t}-tp{t}-zero{z}" for w, t, z in LAYOUTS])
def test_trainer_equals_one_device(world, t, zero, sp):
    ranks = run_ranks(world, "threads", train_rank, args=(tp_config(world, t, sp, zero), STEPS), timeout_s=60)
    assert_trains_like(ranks, _one_device())


@pytest.mark.parametrize("over", [dict(train__micro_batches=2), dict(memory__checkpointing="blocks")],
                         ids=["accumulation", "checkpointing"])
def test_accumulation_and_checkpointing_compose(over):
    """Two micro-batches per step (the data-parallel reduce on the last, the tensor-parallel collectives in
    every one), and blocks recomputed in backward (their collectives issued again): one device's training."""
    one = _one_device(**over)
    for world, t, zero in ((2, 2, 0), (4, 2, 2)):
        cfg = tp_config(world, t, True, zero, **over)
        assert_trains_like(run_ranks(world, "threads", train_rank, args=(cfg, STEPS), timeout_s=60), one)


@pytest.mark.parametrize("world, t, zero, sp", [(2, 2, 0, True), (4, 2, 1, True), (4, 2, 3, False)])
def test_on_processes(world, t, zero, sp):
    cfg = tp_config(world, t, sp, zero)
    ranks = run_ranks(world, "processes", train_rank, args=(cfg, STEPS), timeout_s=120)
    assert_trains_like(ranks, _one_device())


def test_replicated_parameters_stay_bitwise_equal_across_the_group():
    """DP 2 x TP 2 with SP: the LayerNorms saw different tokens on each TP rank; after their gradients'
    sum they are the same bits on every rank."""
    ranks = run_ranks(4, "threads", digest_rank, args=(tp_config(4, 2, True, 0), STEPS), timeout_s=60)
    assert len({r["digest"] for r in ranks}) == 1


@pytest.mark.parametrize("world, zero", [(2, 0), (4, 2)])
def test_an_overflow_on_one_shard_is_skipped_by_every_rank(world, zero):
    """fp16: an inf in one rank's shard of a sharded weight (a gradient no other rank holds) makes every rank
    of the mesh skip that step and halve its loss scale alike."""
    cfg = tp_config(world, 2, True, zero, precision__dtype="fp16", precision__init_scale=1024.0)
    ranks = run_ranks(world, "threads", overflow_rank, args=(cfg, STEPS, world - 1), timeout_s=60)
    assert all(r["skipped"] == [True, False, False] for r in ranks)
    assert len({r["scale"] for r in ranks}) == 1 and ranks[0]["scale"] < 1024.0
    assert all(r["finite"] for r in ranks)


@pytest.mark.parametrize("dtype, rtol", [("fp16", 5e-3), ("bf16", 3e-2)])
def test_mixed_precision_trains_what_one_device_trains(dtype, rtol):
    """fp16 (scaled) and bf16 at DP 2 x TP 2 with SP and ZeRO-2: the same steps skipped or taken, the losses
    within the precision's rounding of a one-device run's."""
    over = dict(precision__dtype=dtype, precision__init_scale=1024.0)
    one = _one_device(**over)
    cfg = tp_config(4, 2, True, 2, **over)
    for r in run_ranks(4, "threads", train_rank, args=(cfg, STEPS), timeout_s=60):
        assert r["skipped"] == one["skipped"] and r["scale"] == one["scale"]
        np.testing.assert_allclose(r["losses"], one["losses"], rtol=rtol)
