"""engine.reference, the readable spine: its gradients against central finite differences of its own
forwards (so the reference is right on its own), then the fast paths held to it in float64 — the fused
ops of engine.ops (forward and backward, on the compiled loops and on NumPy's chains) and engine.optim's
chunked AdamW."""

from __future__ import annotations

import numpy as np
import pytest
from numeric_helpers import kernel_paths, numeric_grad

from engine import ops, reference
from engine.optim import AdamW
from engine.tensor import Tensor


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)




# ---- the reference's backwards are the derivatives of its forwards ---------------------------------

def test_reference_gelu_backward_is_the_derivative():
    x, g = rand(3, 5, seed=1) * 3, rand(3, 5, seed=2)
    np.testing.assert_allclose(reference.gelu_backward(x, g), numeric_grad(reference.gelu, [x], 0, g),
                               rtol=1e-6, atol=1e-8)


def test_reference_layer_norm_backward_is_the_derivative():
    x, w, b, g = rand(2, 3, 5, seed=1) * 2 + 1, rand(5, seed=2), rand(5, seed=3), rand(2, 3, 5, seed=4)
    dx, dw, db = reference.layer_norm_backward(x, w, g)

    def forward(x, w, b):
        return reference.layer_norm(x, w, b)[0]
    for i, got in enumerate((dx, dw, db)):
        np.testing.assert_allclose(got, numeric_grad(forward, [x, w, b], i, g), rtol=1e-6, atol=1e-8)


def test_reference_attention_backward_is_the_derivative():
    q, k, v, g = (rand(2, 2, 5, 3, seed=s) for s in range(4))
    for i, got in enumerate(reference.causal_attention_backward(q, k, v, g)):
        np.testing.assert_allclose(got, numeric_grad(reference.causal_attention, [q, k, v], i, g),
                                   rtol=1e-6, atol=1e-8)


def test_reference_cross_entropy_backward_is_the_derivative():
    logits, targets = rand(2, 3, 6) * 3, np.array([[0, 5, 2], [2, 2, 1]])
    expected = numeric_grad(lambda x: reference.cross_entropy(x, targets), [logits], 0, 1.7)
    np.testing.assert_allclose(reference.cross_entropy_backward(logits, targets, 1.7), expected,
                               rtol=1e-6, atol=1e-8)


def test_reference_cross_entropy_is_minus_log_softmax_at_the_target():
    logits, targets = rand(4, 6), np.array([0, 5, 2, 2])
    p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    assert reference.cross_entropy(logits, targets) == pytest.approx(-np.log(p[range(4), targets]).mean(),
                                                                     rel=1e-14)


def test_reference_adamw_first_step_moves_each_element_by_lr():
    """Step 1 with bias correction: m^ = g and v^ = g^2, so p moves by lr g / (|g| + eps), after decay."""
    p, g = rand(6, seed=1), rand(6, seed=2)
    mask = np.array([True, False] * 3)
    out, m, v = reference.adamw_step(p, g, np.zeros(6), np.zeros(6), 1, 0.1, (0.9, 0.95), 0.0, 0.5, mask)
    decayed = np.where(mask, p * 0.95, p)
    np.testing.assert_allclose(out, decayed - 0.1 * np.sign(g), rtol=1e-14)
    np.testing.assert_allclose(m, 0.1 * g, rtol=1e-14)  # 1 - 0.9 and 1 - 0.95 round
    np.testing.assert_allclose(v, 0.05 * g * g, rtol=1e-14)


# ---- the fused ops equal the reference in float64, on both paths -----------------------------------

@pytest.fixture(params=["compiled", "numpy"])
def path(request):
    yield from kernel_paths(request)


def forward_backward(fn, arrays, g):
    """fn's output and the gradients of every input for upstream gradient g, through the tape."""
    tensors = [Tensor(a.copy(), requires_grad=True) for a in arrays]
    out = fn(*tensors)
    out.backward(g)
    return out.data, [t.grad for t in tensors]


def test_ops_gelu_equals_reference(path):
    x, g = rand(4, 257, seed=1) * 3, rand(4, 257, seed=2)
    out, (dx,) = forward_backward(ops.gelu, [x], g)
    np.testing.assert_allclose(out, reference.gelu(x), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(dx, reference.gelu_backward(x, g), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("bias", [True, False])
def test_ops_layer_norm_equals_reference(path, bias):
    x, w, b, g = rand(3, 9, 40, seed=1) * 2 + 1, rand(40, seed=2), rand(40, seed=3), rand(3, 9, 40, seed=4)
    arrays = [x, w, b] if bias else [x, w]
    out, grads = forward_backward(ops.layer_norm, arrays, g)
    y, _, _ = reference.layer_norm(x, w, b if bias else None)
    dx, dw, db = reference.layer_norm_backward(x, w, g)
    np.testing.assert_allclose(out, y, rtol=1e-10, atol=1e-12)
    for got, want in zip(grads, (dx, dw, db)):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-11)


def test_ops_causal_attention_equals_reference(path):
    q, k, v, g = (rand(2, 3, 7, 4, seed=s) for s in range(4))
    out, grads = forward_backward(ops.causal_attention, [q, k, v], g)
    np.testing.assert_allclose(out, reference.causal_attention(q, k, v), rtol=1e-12, atol=1e-14)
    for got, want in zip(grads, reference.causal_attention_backward(q, k, v, g)):
        np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-13)


def test_ops_cross_entropy_equals_reference(path):
    logits, targets = rand(3, 5, 11, seed=1) * 3, np.random.default_rng(2).integers(0, 11, (3, 5))
    loss, (dlogits,) = forward_backward(lambda t: ops.cross_entropy(t, targets), [logits], np.float64(0.7))
    np.testing.assert_allclose(loss, reference.cross_entropy(logits, targets), rtol=1e-13)
    np.testing.assert_allclose(dlogits, reference.cross_entropy_backward(logits, targets, 0.7),
                               rtol=1e-12, atol=1e-15)


# ---- engine.optim's AdamW equals the reference step --------------------------------------------------

@pytest.mark.parametrize("n", [7, 3 * (1 << 16) + 5])  # within one chunk; several chunks, the last partial
def test_adamw_steps_equal_reference(n):
    rng = np.random.default_rng(n)
    p = rng.standard_normal(n)
    mask = rng.random(n) < 0.5
    hyper = dict(betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    opt = AdamW(p.copy(), np.zeros(n), lr=1e-2, decay_mask=mask, **hyper)
    ref_p, m, v = p, np.zeros(n), np.zeros(n)
    for t, lr in enumerate((1e-2, 3e-3, 1e-3), start=1):
        opt.grads[:] = rng.standard_normal(n)
        opt.step(lr)
        ref_p, m, v = reference.adamw_step(ref_p, opt.grads, m, v, t, lr, decay_mask=mask, **hyper)
    np.testing.assert_allclose(opt.params, ref_p, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(opt.m, m, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(opt.v, v, rtol=1e-12, atol=1e-15)
