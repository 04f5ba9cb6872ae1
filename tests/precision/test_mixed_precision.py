"""fp16 (dynamic loss scaling) and bf16 train a small GPT on the stdlib corpus as well as fp32 does:
the validation loss after the same number of steps is within 2% of fp32's. The low-precision runs are
sharded (ZeRO-2 and ZeRO-3 on two ranks), so the fp32 master weights live in the shards."""

from __future__ import annotations

import pytest

from engine.comm.launch import run_ranks
from engine.config import from_dict, to_dict

STEPS = 100


def small_gpt(dtype: str, world: int = 1, stage: int = 0) -> dict:
    """A reduced gpt-mini (2 layers, width 32, context 32) that still learns clearly in 100 steps."""
    return to_dict(from_dict({
        "name": f"mixed-{dtype}", "seed": 1337,
        "model": {"kind": "gpt", "n_layer": 2, "n_head": 4, "n_embd": 32, "block_size": 32},
        "data": {"kind": "stdlib", "max_chars": 200000},
        "train": {"steps": STEPS, "global_batch": 16, "eval_every": 0, "eval_batches": 4},
        "optim": {"lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 20, "beta2": 0.99},
        "parallel": {"world_size": world, "zero_stage": stage},
        "precision": {"dtype": dtype}}))


def _fit(comm, emit, cfg_dict):
    from engine.trainer import Trainer
    events: list = []
    trainer = Trainer(from_dict(cfg_dict), comm, emit=events.append)
    summary = trainer.fit()
    trainer.replica.close()
    summary["skipped"] = sum(1 for e in events if e["kind"] == "step_end" and e["skipped"])
    summary["scale"] = trainer.replica.loss_scale
    return summary


def fit(cfg_dict: dict) -> dict:
    world = cfg_dict["parallel"]["world_size"]
    return run_ranks(world, "threads", _fit, args=(cfg_dict,), timeout_s=120)[0]


@pytest.fixture(scope="module")
def fp32():
    return fit(small_gpt("fp32"))


@pytest.mark.parametrize("dtype, stage", [("fp16", 2), ("bf16", 3)])
def test_low_precision_trains_within_2_percent_of_fp32(fp32, dtype, stage):
    low = fit(small_gpt(dtype, world=2, stage=stage))
    assert low["steps"] == fp32["steps"] == STEPS
    assert fp32["final_val_loss"] < fp32["initial_val_loss"] - 1.0  # the loss clearly falls
    assert abs(low["final_val_loss"] - fp32["final_val_loss"]) <= 0.02 * fp32["final_val_loss"]
    if dtype == "fp16":  # dynamic scaling was live: a finite scale, at most a few skipped steps
        assert 1.0 <= low["scale"] <= 65536.0 and low["skipped"] <= 5
    else:
        assert low["scale"] == 1.0 and low["skipped"] == 0
