"""Activation checkpointing: bitwise-identical gradients (dropout included), hooks that fire once,
one extra forward per checkpointed block, and composition with DDP and ZeRO-2/3 in the trainer."""

from __future__ import annotations

import numpy as np
import pytest

from engine import nn, ops
from engine.comm.launch import run_ranks
from engine.config import from_dict, to_dict
from engine.recompute import apply_checkpointing, checkpointed_blocks, recomputing
from engine.tensor import no_grad
from engine.trainer import Trainer


def gpt(spec: str, dtype=np.float32, dropout=0.1, n_layer=3) -> nn.GPT:
    model = nn.GPT(vocab_size=29, block_size=12, n_layer=n_layer, n_head=2, n_embd=16, dropout=dropout,
                   dtype=dtype)
    nn.init_params(model, 5)
    assert apply_checkpointing(model, spec) == checkpointed_blocks(spec, n_layer)
    return model


def batch(seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 29, (3, 12)), rng.integers(0, 29, (3, 12))


def run_grads(spec, dtype=np.float32, backwards=2):
    """Gradients after `backwards` accumulated backward passes, the losses and the final RNG state."""
    model = gpt(spec, dtype)
    losses = []
    for i in range(backwards):
        x, y = batch(i)
        loss = ops.cross_entropy(model(x), y)
        loss.backward()
        losses.append(float(loss.data))
    return {n: p.grad.copy() for n, p in model.named_parameters()}, losses, model.rng.position()


def test_spec_names_the_blocks():
    assert checkpointed_blocks("none", 4) == []
    assert checkpointed_blocks("blocks", 4) == [0, 1, 2, 3]
    assert checkpointed_blocks("every:2", 5) == [0, 2, 4]
    assert checkpointed_blocks("every:1", 3) == [0, 1, 2]
    with pytest.raises(ValueError):
        checkpointed_blocks("every:0", 3)
    with pytest.raises(ValueError):
        apply_checkpointing(nn.MLP([4, 8, 2]), "blocks")
    assert apply_checkpointing(nn.MLP([4, 8, 2]), "none") == []


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("spec", ["blocks", "every:2"])
def test_gradients_are_bitwise_identical_with_dropout(spec, dtype):
    plain_grads, plain_losses, plain_rng = run_grads("none", dtype)
    grads, losses, rng = run_grads(spec, dtype)
    assert losses == plain_losses
    for name, g in plain_grads.items():
        np.testing.assert_array_equal(grads[name], g, err_msg=name)
    assert rng == plain_rng  # the rest of the step sees the same dropout stream


def test_grad_ready_hooks_fire_once_with_final_gradients():
    fired = {}
    model = gpt("blocks")
    reference, _, _ = run_grads("none", backwards=1)
    for name, p in model.named_parameters():
        p.register_grad_ready_hook(lambda q, name=name: fired.setdefault(name, []).append(q.grad.copy()))
    x, y = batch(0)
    ops.cross_entropy(model(x), y).backward()
    assert sorted(fired) == sorted(reference)
    for name, seen in fired.items():
        assert len(seen) == 1, name
        np.testing.assert_array_equal(seen[0], reference[name], err_msg=name)


def test_each_checkpointed_block_runs_forward_twice_and_hooks_rerun():
    model = gpt("every:2", n_layer=4)
    calls = {i: 0 for i in range(4)}
    seen_recompute = []
    for i, block in enumerate(model.blocks):
        def count(module, i=i):
            calls[i] += 1
            seen_recompute.append(recomputing())
        block.forward_pre_hooks.append(count)
    x, y = batch(0)
    ops.cross_entropy(model(x), y).backward()
    assert calls == {0: 2, 1: 1, 2: 2, 3: 1}  # the pre-hooks run again in the recompute (ZeRO-3 gathers)
    assert seen_recompute.count(True) == 2


def test_evaluation_without_tape_is_unchanged():
    x, _ = batch(0)
    plain, ckpt = gpt("none").eval(), gpt("blocks").eval()
    with no_grad():
        np.testing.assert_array_equal(ckpt(x).data, plain(x).data)


def tiny(**over) -> dict:
    d = {"name": "ckpt", "seed": 4,
         "model": {"kind": "gpt", "n_layer": 3, "n_head": 2, "n_embd": 16, "block_size": 8, "dropout": 0.1,
                   "vocab_size": 27, "bias": False},
         "data": {"kind": "synthetic-lm", "n_samples": 256},
         "train": {"steps": 3, "global_batch": 8, "micro_batches": 2, "eval_every": 0, "eval_batches": 1},
         "optim": {"lr": 1e-2, "warmup_steps": 0, "grad_clip": 1.0},
         "parallel": {"world_size": 2, "bucket_cap_mb": 0.002}, "precision": {"dtype": "fp64"},
         "memory": {"checkpointing": "none"}}
    for key, value in over.items():
        section, name = key.split("__")
        d[section][name] = value
    return to_dict(from_dict(d))


def _train(comm, emit, cfg_dict, steps):
    trainer = Trainer(from_dict(cfg_dict), comm)
    try:
        losses = [trainer.train_step()["loss"] for _ in range(steps)]
        return {"losses": losses, "params": trainer.replica.optimizer.local_state()["master"]}
    finally:
        trainer.replica.close()


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_trainer_with_checkpointing_matches_without(stage):
    """Through the trainer: DDP buckets, ZeRO-2 reduce-scatter and ZeRO-3 gathers all run off the grad-ready
    and forward hooks that the recompute fires; every rank's parameters end bitwise equal."""
    runs = {}
    for spec in ("none", "blocks"):
        cfg = tiny(memory__checkpointing=spec, parallel__zero_stage=stage)
        runs[spec] = run_ranks(2, "threads", _train, args=(cfg, 3), timeout_s=60)
    for plain, ckpt in zip(runs["none"], runs["blocks"]):
        assert ckpt["losses"] == plain["losses"]
        np.testing.assert_array_equal(ckpt["params"], plain["params"])


def test_bench_step_reports_the_recompute_cost():
    import json

    from typer.testing import CliRunner

    from nanodist_tui.cli import app
    args = ["bench", "step", "--preset", "checkpointing", "--steps", "2", "--warmup", "0", "--json",
            "--world-size", "2", "--set", "model.n_layer=2", "--set", "model.n_embd=16",
            "--set", "model.n_head=2", "--set", "model.block_size=8", "--set", "train.global_batch=4",
            "--set", "data.max_chars=20000"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)["checkpointing"]
    assert report["spec"] == "blocks" and report["on_s"] > 0 and report["off_s"] > 0
    assert report["extra"] == pytest.approx(report["on_s"] / report["off_s"] - 1)
