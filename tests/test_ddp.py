"""DDP equals one process on the same global batch; ranks stay bitwise identical; runs are deterministic."""

from __future__ import annotations

import numpy as np
import pytest

from engine.comm.launch import run_ranks
from engine.config import from_dict, to_dict
from engine.ddp import NaiveDataParallel
from engine.trainer import Trainer
from engine.zero import make_replica


def tiny_gpt(**over) -> dict:
    d = {
        "name": "tiny", "seed": 3,
        # No biases: the attention key bias has an exactly-zero true gradient (softmax ignores a constant
        # shift), so its computed gradient is rounding noise that Adam's normalisation turns into O(lr)
        # steps of random sign — no two summation orders agree on it, in any precision.
        "model": {"kind": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 16, "block_size": 8, "dropout": 0.0,
                  "bias": False},
        "data": {"kind": "synthetic-lm", "n_samples": 512},
        "train": {"steps": 10, "global_batch": 8, "micro_batches": 1, "eval_every": 0, "eval_batches": 1},
        "optim": {"lr": 1e-2, "warmup_steps": 2, "grad_clip": 1.0},
        "parallel": {"world_size": 1, "bucket_cap_mb": 0.002},  # tiny buckets: many of them
        "precision": {"dtype": "fp32"},
    }
    for key, value in over.items():
        section, name = key.split("__")
        d[section][name] = value
    d["model"]["vocab_size"] = 32
    return to_dict(from_dict(d))


def _train(comm, emit, cfg_dict, steps, naive=False):
    cfg = from_dict(cfg_dict)
    trainer = Trainer(cfg, comm, replica_factory=NaiveDataParallel if naive else make_replica)
    losses, params = [], []
    for _ in range(steps):
        losses.append(trainer.train_step()["loss"])
        params.append(trainer.replica.flat.data.copy())
    return {"losses": losses, "params": params}


def run(cfg_dict, world, backend="threads", steps=10, naive=False):
    cfg_dict = dict(cfg_dict, parallel=dict(cfg_dict["parallel"], world_size=world, backend=backend))
    return run_ranks(world, backend, _train, args=(cfg_dict, steps, naive), timeout_s=60)


def assert_replicas_identical(results):
    for step in range(len(results[0]["params"])):
        for r in results[1:]:
            np.testing.assert_array_equal(r["params"][step], results[0]["params"][step])


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("dtype, rtol", [("fp32", 1e-6), ("fp64", 1e-12)])
def test_ddp_equals_single_process(world, dtype, rtol):
    cfg = tiny_gpt(precision__dtype=dtype)
    single = run(cfg, 1)[0]
    multi = run(cfg, world)
    assert_replicas_identical(multi)
    np.testing.assert_allclose(multi[0]["losses"], single["losses"], rtol=rtol)
    scale = np.abs(single["params"][-1]).max()
    np.testing.assert_allclose(multi[0]["params"][-1], single["params"][-1], rtol=rtol, atol=rtol * scale)


@pytest.mark.parametrize("world", [2, 4])
def test_ddp_with_gradient_accumulation(world):
    cfg = tiny_gpt(precision__dtype="fp64", train__micro_batches=2, train__global_batch=16)
    single = run(cfg, 1)[0]
    multi = run(cfg, world)
    assert_replicas_identical(multi)
    np.testing.assert_allclose(multi[0]["losses"], single["losses"], rtol=1e-12)
    np.testing.assert_allclose(multi[0]["params"][-1], single["params"][-1], rtol=1e-12, atol=1e-13)


def test_naive_and_bucketed_agree():
    cfg = tiny_gpt(precision__dtype="fp64")
    bucketed = run(cfg, 2, steps=4)
    naive = run(cfg, 2, steps=4, naive=True)
    np.testing.assert_allclose(naive[0]["params"][-1], bucketed[0]["params"][-1], rtol=1e-12, atol=1e-14)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_ddp_on_processes_equals_single_process(world):
    cfg = tiny_gpt()
    single = run(cfg, 1, steps=10)[0]
    multi = run(cfg, world, backend="processes", steps=10)
    assert_replicas_identical(multi)
    np.testing.assert_allclose(multi[0]["losses"], single["losses"], rtol=1e-6)
    scale = np.abs(single["params"][-1]).max()
    np.testing.assert_allclose(multi[0]["params"][-1], single["params"][-1], rtol=1e-6, atol=1e-6 * scale)


def test_same_seed_same_losses_bitwise():
    cfg = tiny_gpt(model__dropout=0.1)
    a, b = run(cfg, 1, steps=5)[0], run(cfg, 1, steps=5)[0]
    assert a["losses"] == b["losses"]
    np.testing.assert_array_equal(a["params"][-1], b["params"][-1])
