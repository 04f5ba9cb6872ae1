"""Tensor parallelism (and sequence parallelism) on a whole GPT trains what one device trains, float64,
threads backend: t in {2, 3, 4}, with and without SP — logits, loss and every gradient within 1e-12
relative, parameters after 3 AdamW steps with clipping (the norm combined over the group) within 1e-10;
a vocabulary that t divides and one it does not; untied output weights; dropout equal to one device's;
activation checkpointing bitwise equal to none; float32 within 1e-5;
replicated parameters bitwise equal across the group; two TP groups side by side in one world; an MLP."""

from __future__ import annotations

import numpy as np
import pytest

from engine.comm.launch import run_ranks
from engine.nn import MLP
from engine.parallel.tensor import parallelize
from tests.tp_helpers import (
    BLOCK,
    VOCAB,
    assert_close,
    dense_step,
    random_batches,
    tiny_gpt,
    tp_group,
    tp_step_rank,
    tp_train_rank,
    train_dense,
)

DEGREES = [2, 3, 4]
LAYOUTS = [False, True]


def _layout_id(sp: bool) -> str:
    return "tp+sp" if sp else "tp"


def assert_step_matches(ranks: list[dict], dense: dict, rtol: float = 1e-12) -> None:
    for r in ranks:
        assert_close(r["logits"], dense["logits"], rtol)
        assert abs(r["loss"] - dense["loss"]) <= rtol * abs(dense["loss"])
        assert r["grads"].keys() == dense["grads"].keys()
        for name, grad in dense["grads"].items():
            assert_close(r["grads"][name], grad, rtol)
        if "grad_norm" in r:  # shards' squares summed over the group, replicated ones counted once
            norm = np.sqrt(sum(np.sum(g**2) for g in dense["grads"].values()))
            assert abs(r["grad_norm"] - norm) <= rtol * norm


@pytest.mark.parametrize("sp", LAYOUTS, ids=_layout_id)
@pytest.mark.parametrize("vocab", [VOCAB, 12], ids=["vocab 11 (padded)", "vocab 12"])
@pytest.mark.parametrize("t", DEGREES)
def test_one_step_equals_one_device(t, vocab, sp):
    x, y = random_batches(1, vocab=vocab, seed=t)[0]
    model_fn = lambda: tiny_gpt(vocab)  # noqa: E731
    dense = dense_step(model_fn(), x, y)
    ranks = run_ranks(t, "threads", tp_step_rank, args=(t, model_fn, x, y, sp), timeout_s=60)
    assert_step_matches(ranks, dense)
    assert ranks[0]["local_logits_shape"] == (2, BLOCK, -(-vocab // t))  # never [b, s, V] on a rank


@pytest.mark.parametrize("sp", LAYOUTS, ids=_layout_id)
def test_untied_output_weights(sp):
    x, y = random_batches(1, seed=5)[0]
    model_fn = lambda: tiny_gpt(tie_weights=False)  # noqa: E731
    ranks = run_ranks(3, "threads", tp_step_rank, args=(3, model_fn, x, y, sp), timeout_s=60)
    assert_step_matches(ranks, dense_step(model_fn(), x, y))
    assert "lm_head.weight" in ranks[0]["grads"]


@pytest.mark.parametrize("sp", LAYOUTS, ids=_layout_id)
@pytest.mark.parametrize("t", [2, 4])
def test_dropout_masks_equal_one_devices(t, sp):
    """Attention's dropout (heads split) and, under SP, the embedding's and the residual ones (sequence
    split) draw each rank's part of the one-device masks: the same gradients."""
    x, y = random_batches(1, seed=7)[0]
    model_fn = lambda: tiny_gpt(dropout=0.2)  # noqa: E731
    dense = dense_step(model_fn(), x, y)
    assert abs(dense["loss"] - dense_step(tiny_gpt(), x, y)["loss"]) > 1e-3  # dropout changed the loss
    assert_step_matches(run_ranks(t, "threads", tp_step_rank, args=(t, model_fn, x, y, sp), timeout_s=60),
                        dense)


@pytest.mark.parametrize("sp", LAYOUTS, ids=_layout_id)
@pytest.mark.parametrize("t", DEGREES)
def test_three_adamw_steps_equal_one_device(t, sp):
    batches = random_batches(3, seed=11)
    dense = train_dense(tiny_gpt, batches)
    untrained = {n: p.data for n, p in tiny_gpt().named_parameters()}
    assert max(np.abs(dense[n] - untrained[n]).max() for n in dense) > 1e-3  # the steps moved it
    ranks = run_ranks(t, "threads", tp_train_rank, args=(t, tiny_gpt, batches, sp), timeout_s=60)
    for r in ranks:
        for name, p in dense.items():
            assert_close(r["params"][name], p, 1e-10)
        # replicated parameters (LayerNorms, row-parallel biases, positions) stay bitwise equal
        for name, p in r["replicated"].items():
            np.testing.assert_array_equal(p, ranks[0]["replicated"][name])
    assert "blocks.0.ln_1.weight" in ranks[0]["replicated"]


@pytest.mark.parametrize("sp", LAYOUTS, ids=_layout_id)
def test_activation_checkpointing_reissues_the_collectives(sp):
    """The recompute re-runs each block with its collectives (and its dropout masks): the same bits."""
    x, y = random_batches(1, seed=19)[0]
    model_fn = lambda: tiny_gpt(dropout=0.1)  # noqa: E731
    plain = run_ranks(2, "threads", tp_step_rank, args=(2, model_fn, x, y, sp), timeout_s=60)
    recomputed = run_ranks(2, "threads", tp_step_rank, args=(2, model_fn, x, y, sp, "blocks"), timeout_s=60)
    for a, b in zip(plain, recomputed):
        for name, grad in a["grads"].items():
            np.testing.assert_array_equal(b["grads"][name], grad)


@pytest.mark.parametrize("sp", LAYOUTS, ids=_layout_id)
def test_float32(sp):
    x, y = random_batches(1, seed=23)[0]
    model_fn = lambda: tiny_gpt(dtype=np.float32)  # noqa: E731
    ranks = run_ranks(2, "threads", tp_step_rank, args=(2, model_fn, x, y, sp), timeout_s=60)
    assert_step_matches(ranks, dense_step(model_fn(), x, y), rtol=1e-5)


def test_dropout_training_with_sequence_parallelism_equals_one_device():
    batches = random_batches(3, seed=13)
    model_fn = lambda: tiny_gpt(dropout=0.1)  # noqa: E731
    dense = train_dense(model_fn, batches)
    for r in run_ranks(2, "threads", tp_train_rank, args=(2, model_fn, batches, True), timeout_s=60):
        for name, p in dense.items():
            assert_close(r["params"][name], p, 1e-10)


def test_two_tensor_parallel_groups_in_one_world():
    """World of 4, TP groups [0, 1] and [2, 3]: each group trains on its own, through its own ranks."""
    x, y = random_batches(1, seed=17)[0]
    dense = dense_step(tiny_gpt(), x, y)
    ranks = run_ranks(4, "threads", tp_step_rank, args=(2, tiny_gpt, x, y, True), timeout_s=60)
    assert_step_matches(ranks, dense)


def _mlp() -> MLP:
    return MLP([6, 12, 5], dropout=0.25, dtype=np.float64)


def _mlp_rank(comm, emit, t, x, y):
    model = parallelize(_mlp(), tp_group(comm, t))
    tp = model.tensor_parallel
    model.rng.begin(0, 0)
    logits = model(x)
    loss = tp.loss(logits, y)
    loss.backward()
    return {"logits": logits.data, "loss": float(loss.data), "grads": tp.dense("grad"),
            "grad_norm": tp.grad_norm()}


@pytest.mark.parametrize("t", [2, 3])
def test_an_mlp_model(t):
    """Its layers as a (column, row) pair, the hidden layer's dropout split by features; whole logits."""
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((8, 6)), rng.integers(0, 5, 8)
    dense = dense_step(_mlp(), x, y)
    assert_step_matches(run_ranks(t, "threads", _mlp_rank, args=(t, x, y), timeout_s=60), dense)
