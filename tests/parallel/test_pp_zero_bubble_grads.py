"""The zero-bubble split of backward (engine/backward_split.py): backward_input then the weight half give
bitwise the gradients one backward gives — for every op kind in a GPT block and around it, and for whole
GPT stages (checkpointed or not, with dropout), in float32 and float64 — while the input half really leaves
the weight products for later."""

from __future__ import annotations

import numpy as np
import pytest

from engine import ops
from engine.backward_split import backward_input
from engine.dropout_rng import DropoutRNG
from engine.tensor import Parameter, Tensor
from tests.pp_stage_helpers import micro_batches, model_fn, run_step, runners

DTYPES = [np.float32, np.float64]
B, T, C = 2, 5, 8


def _param(rng, *shape, dtype) -> Parameter:
    return Parameter((rng.standard_normal(shape) * 0.5).astype(dtype), name=f"p{shape}")


def _graphs(dtype):
    """name -> (build(x leaf [B, T, C], params) -> output Tensor, params)."""
    rng = np.random.default_rng(5)
    w, bias, w2 = (_param(rng, *shape, dtype=dtype) for shape in ((3 * C, C), (3 * C,), (C, C)))
    batched, emb, pos = (_param(rng, *shape, dtype=dtype) for shape in ((B, C, C), (11, C), (T, C)))
    ln_w, ln_b = (_param(rng, C, dtype=dtype) for _ in range(2))
    idx = rng.integers(0, 11, (B, T))
    drop = DropoutRNG(3)

    def keyed() -> DropoutRNG:  # the same masks in both runs
        drop.begin(1, 0)
        return drop
    return {
        "linear with bias": (lambda x: ops.linear(x, w, bias), [w, bias]),
        "linear without bias": (lambda x: ops.linear(x, w2), [w2]),
        "matmul, parameter on the right": (lambda x: x @ w2, [w2]),
        "matmul, parameter on the left": (lambda x: ops.matmul(batched, x.transpose(0, 2, 1)), [batched]),
        "batched matmul with a parameter": (lambda x: x @ batched, [batched]),
        "layer norm": (lambda x: ops.layer_norm(x, ln_w, ln_b), [ln_w, ln_b]),
        "bias add, broadcast": (lambda x: x + ln_b, [ln_b]),
        "parameter product, broadcast": (lambda x: x * ln_w, [ln_w]),
        "embedding and positions": (lambda x: x + ops.embedding(idx, emb) + pos[:T], [emb, pos]),
        "gelu and dropout": (lambda x: ops.dropout(ops.gelu(ops.linear(x, w2)), 0.3, keyed(), True), [w2]),
        "attention": (lambda x: ops.causal_attention_qkv(ops.linear(x, w, bias), 2, 0.2, keyed(), True),
                      [w, bias]),
        "weight used twice": (lambda x: ops.linear(ops.linear(x, w2), w2), [w2]),
        "cross-entropy over a tied head": (
            lambda x: ops.cross_entropy(ops.linear(x + ops.embedding(idx, emb), emb), idx), [emb]),
    }


def _grads(build, params, x_data, seed, split: bool):
    for p in params:
        p.grad = None
    x = Tensor(x_data.copy(), requires_grad=True)
    out = build(x)
    root = out._node
    g = seed[: out.size].reshape(out.shape).astype(out.dtype)  # a scalar's: seed[0]
    if split:
        weights = backward_input(root, g)
        assert all(p.grad is None for p in params)  # nothing written to the weights yet
        x_grad = x.grad.copy()
        weights.run()
    else:
        out.backward(g)
        x_grad = x.grad
    return x_grad, [p.grad.copy() for p in params]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(_graphs(np.float64)))
def test_input_then_weight_is_backward_bitwise(name, dtype):
    build, params = _graphs(dtype)[name]
    rng = np.random.default_rng(9)
    x_data, seed = rng.standard_normal((B, T, C)).astype(dtype), rng.standard_normal(B * T * 3 * C)
    whole = _grads(build, params, x_data, seed, split=False)
    halves = _grads(build, params, x_data, seed, split=True)
    np.testing.assert_array_equal(halves[0], whole[0])
    for got, expected in zip(halves[1], whole[1]):
        np.testing.assert_array_equal(got, expected)


def test_the_input_half_leaves_the_weight_products():
    """Linear's weight product is not computed in the input half: its operands stay saved until the weight
    half (a node kept), and the weight's gradient appears only then."""
    rng = np.random.default_rng(2)
    w = Parameter(rng.standard_normal((C, C)), name="w")
    x = Tensor(rng.standard_normal((B, T, C)), requires_grad=True)
    out = ops.linear(ops.gelu(x), w)
    linear_node = out._node
    weights = backward_input(linear_node, np.ones(out.shape))
    assert x.grad is not None and w.grad is None
    assert linear_node.backward is not None  # kept, with what it saved, for the weight product
    weights.run()
    assert w.grad is not None and linear_node.backward is None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("checkpointing", "dropout"), [("none", 0.0), ("none", 0.2), ("blocks", 0.2)])
@pytest.mark.parametrize("order", ["split", "split-1f1b"])
def test_whole_stages_split_equal_backward_bitwise(dtype, checkpointing, dropout, order):
    build = model_fn(n_layer=4, dropout=dropout, checkpointing=checkpointing, dtype=dtype)
    batches = micro_batches(3)
    whole = run_step(runners(build, 3), batches, "gpipe" if order == "split" else "1f1b")
    halves = run_step(runners(build, 3), batches, order)
    assert halves["losses"] == whole["losses"]
    assert sorted(halves["grads"]) == sorted(whole["grads"])
    for name, g in whole["grads"].items():
        np.testing.assert_array_equal(halves["grads"][name], g, err_msg=name)


def test_a_checkpointed_stage_defers_its_blocks_weights_too():
    """The recompute inside the input half is split as well: its blocks' weights wait for the weight half,
    and their grad-ready hooks fire there, once each."""
    (runner,) = runners(model_fn(n_layer=4, checkpointing="blocks"), 2)
    fired: list[str] = []
    for name, p in runner.named_parameters():
        p.register_grad_ready_hook(lambda q, n=name: fired.append(n))
    runner.begin_step(micro_batches(1), 1.0)
    runner.forward(1, 0, runner.forward(0, 0, None))
    g = runner.backward_input(1, 0, None)
    assert g is not None and fired == []
    assert all(p.grad is None for _, p in runner.named_parameters())
    runner.backward_weight(1, 0)
    runner.backward_input(0, 0, g)
    runner.backward_weight(0, 0)
    assert sorted(fired) == sorted(n for n, _ in runner.named_parameters())
