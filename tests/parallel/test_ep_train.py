"""The Trainer with expert parallelism trains what expert parallelism 1 trains (float64, 4 thread ranks of
data parallelism): EP 2 and 4, top-1 and top-2, dropless and under a capacity, two micro-batches — the loss
and gradient norm of every step and every parameter after 3 clipped AdamW steps within 1e-10, each expert
read from the rank that holds it, and equal on every rank that holds it; the all-to-alls metered under the
EP group."""

from __future__ import annotations

import numpy as np
import pytest

from engine.comm.launch import run_ranks
from engine.config import from_dict
from engine.trainer import Trainer
from tests.ep_train_helpers import RTOL, STEPS, moe_config


def train_rank(comm, emit, cfg_dict: dict) -> dict:
    trainer = Trainer(from_dict(cfg_dict), comm)
    try:
        out = [trainer.train_step() for _ in range(STEPS)]
        return {"losses": [s["loss"] for s in out], "norms": [s["grad_norm"] for s in out],
                "params": {n: p.data.copy() for n, p in trainer.model.named_parameters()},
                "phases": sorted({(row["group"], row["phase"]) for row in comm.meter.totals()})}
    finally:
        trainer.replica.close()


def _train(expert: int, top_k: int, capacity_factor: float = 0.0, micro_batches: int = 1) -> list[dict]:
    cfg = moe_config(expert, top_k, capacity_factor, micro_batches)
    return run_ranks(4, "threads", train_rank, args=(cfg,), timeout_s=120)


@pytest.mark.parametrize("top_k, capacity_factor, micro_batches", [(1, 0.0, 1), (2, 0.0, 1), (2, 1.0, 1),
                                                                   (2, 0.0, 2)])
@pytest.mark.parametrize("expert", [2, 4])
def test_expert_parallel_training_equals_ep_1(expert, top_k, capacity_factor, micro_batches):
    one = _train(1, top_k, capacity_factor, micro_batches)
    split = _train(expert, top_k, capacity_factor, micro_batches)
    for r in split:
        np.testing.assert_allclose(r["losses"], one[0]["losses"], rtol=RTOL)
        np.testing.assert_allclose(r["norms"], one[0]["norms"], rtol=RTOL)
    assert one[0]["norms"][0] > 0.05  # clipping acts: the norm's experts-once combination matters
    whole = one[0]["params"]
    held = {}
    for r in split:
        for name, value in r["params"].items():
            held.setdefault(name, value)
            np.testing.assert_array_equal(value, held[name])  # edp replicas (and DP ones) stay equal
    assert held.keys() == whole.keys()
    for name, value in whole.items():
        scale = np.abs(value).max()
        np.testing.assert_allclose(held[name], value, rtol=RTOL, atol=RTOL * scale, err_msg=name)
    experts_on_0 = [n for n in split[0]["params"] if ".mlps." in n]
    assert len(experts_on_0) == len([n for n in whole if ".mlps." in n]) // expert
    phases = {tuple(p) for r in split for p in r["phases"]}
    assert {("ep0", "ep-dispatch"), ("ep0", "ep-combine")} <= phases


def test_strided_ep_groups_train_alike():
    """ep after dp in parallel.order: the EP groups are every other rank ({0, 2}, {1, 3}), edp the rest."""
    cfg = moe_config(2, 2)
    cfg["parallel"]["order"] = "tp-cp-dp-ep-pp"
    split = run_ranks(4, "threads", train_rank, args=(cfg,), timeout_s=120)
    one = _train(1, 2)
    for r in split:
        np.testing.assert_allclose(r["losses"], one[0]["losses"], rtol=RTOL)
    phases = {tuple(p) for r in split for p in r["phases"]}
    assert {("ep0", "ep-dispatch"), ("ep1", "ep-dispatch")} <= phases  # ep0 = {0, 2}, ep1 = {1, 3}


def test_on_processes():
    """The all-to-alls over a process transport: EP 2 on 4 rank processes trains what EP 1 on threads does."""
    cfg = moe_config(2, 2)
    split = run_ranks(4, "processes", train_rank, args=(cfg,), timeout_s=120)
    one = _train(1, 2)
    for r in split:
        np.testing.assert_allclose(r["losses"], one[0]["losses"], rtol=RTOL)
        np.testing.assert_allclose(r["norms"], one[0]["norms"], rtol=RTOL)
