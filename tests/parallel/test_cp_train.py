"""The Trainer with context parallelism trains what one device trains (float64): CP 2 under both layouts,
CP 4, DP 2 x CP 2, CP 2 x TP 2 (both layouts) — the first step's loss and every gradient (tensor-parallel
shards joined) within 1e-12 of one device's, the loss and gradient norm of 3 clipped AdamW steps and every
parameter after them within 1e-10; with ZeRO, activation checkpointing and gradient accumulation; on rank
processes; fp16 and bf16 within their rounding."""

from __future__ import annotations

import numpy as np
import pytest

from engine.comm.launch import run_ranks
from tests.cp_train_helpers import cp_config, grad_rank
from tests.tp_train_helpers import assert_trains_like, train_rank

STEPS = 3


def _run(world: int, cfg: dict, fn=train_rank, steps: int | None = STEPS) -> list[dict]:
    args = (cfg,) if steps is None else (cfg, steps)
    return run_ranks(world, "threads", fn, args=args, timeout_s=120)


GRAD_LAYOUTS = [(2, 2, "zigzag", 1), (2, 2, "contiguous", 1), (4, 4, "zigzag", 1), (4, 2, "zigzag", 1),
                (4, 2, "zigzag", 2), (4, 2, "contiguous", 2)]  # (world, context, layout, tensor)
GRAD_IDS = [f"w{w}-cp{c}-{k}-tp{t}" for w, c, k, t in GRAD_LAYOUTS]


@pytest.mark.parametrize("world, c, layout, t", GRAD_LAYOUTS, ids=GRAD_IDS)
def test_first_step_loss_and_gradients_equal_one_device(world, c, layout, t):
    one = _run(1, cp_config(model__block_size=16), grad_rank, None)[0]
    for r in _run(world, cp_config(world, c, layout, t, model__block_size=16), grad_rank, None):
        assert r["loss"] == pytest.approx(one["loss"], rel=1e-12)
        assert r["grads"].keys() == one["grads"].keys()
        for name, g in one["grads"].items():
            g = np.asarray(g)
            np.testing.assert_allclose(r["grads"][name], g, rtol=1e-12, atol=1e-12 * np.abs(g).max())


def _one_device(**over) -> dict:
    return _run(1, cp_config(**over))[0]


TRAIN_LAYOUTS = [(2, 2, "zigzag", 1, 0), (2, 2, "contiguous", 1, 0), (4, 2, "zigzag", 2, 0),
                 (4, 2, "contiguous", 2, 1), (4, 2, "zigzag", 1, 3)]  # (world, context, layout, tensor, ZeRO)


@pytest.mark.parametrize("world, c, layout, t, zero", TRAIN_LAYOUTS,
                         ids=[f"w{w}-cp{c}-{k}-tp{t}-zero{z}" for w, c, k, t, z in TRAIN_LAYOUTS])
def test_trainer_equals_one_device(world, c, layout, t, zero):
    assert_trains_like(_run(world, cp_config(world, c, layout, t, zero)), _one_device())


def test_sequence_parallel_inside_each_context_slice():
    """CP 2 x TP 2 with sequence parallelism: each rank's slice of a sequence split again over the tensor
    group around the blocks' products."""
    cfg = cp_config(4, 2, "zigzag", 2, 0, parallel__sequence_parallel=True, model__block_size=16)
    assert_trains_like(_run(4, cfg), _one_device(model__block_size=16))


@pytest.mark.parametrize("over", [dict(train__micro_batches=2), dict(memory__checkpointing="blocks")],
                         ids=["accumulation", "checkpointing"])
def test_accumulation_and_checkpointing_compose(over):
    """Two micro-batches per step, and blocks recomputed in backward (their ring hops run again)."""
    assert_trains_like(_run(2, cp_config(2, 2, "zigzag", **over)), _one_device(**over))


@pytest.mark.parametrize("dtype, rtol", [("fp16", 1e-3), ("bf16", 1e-2)])
def test_16_bit(dtype, rtol):
    """In 16 bits the ring merges in float32 and rounds once, as the fused attention does, but the blocks'
    sums run in another order: the losses and norms agree with one device's within the format's rounding."""
    over = dict(precision__dtype=dtype, optim__grad_clip=1.0)
    ranks, one = _run(2, cp_config(2, 2, "zigzag", **over)), _one_device(**over)
    for r in ranks:
        np.testing.assert_allclose(r["losses"], one["losses"], rtol=rtol)
        np.testing.assert_allclose(r["norms"], one["norms"], rtol=10 * rtol)
    assert not any(r["skipped"][-1] for r in ranks)


def test_on_processes():
    """CP 2 x TP 2 on rank processes: the hops cross process boundaries (shared-memory pipes)."""
    ranks = run_ranks(4, "processes", train_rank, args=(cp_config(4, 2, "zigzag", 2), STEPS), timeout_s=120)
    assert_trains_like(ranks, _one_device())
