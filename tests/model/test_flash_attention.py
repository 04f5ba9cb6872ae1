"""ops.causal_attention, the flash-attention op (engine.fast.flash): forward and the three gradients held to
engine.reference's whole-array attention at lengths inside, at and across the tiles; the causal mask; dropout
masks that are keep_mask's, drawn tile by tile (DropoutRNG.mask_site); 16-bit inputs computed in float32;
and the bytes it keeps, in the ledger and in the estimator."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from numeric_helpers import kernel_paths, numeric_grad

from engine import ops, reference
from engine.dropout_rng import DropoutRNG
from engine.fast import flash, lowp
from engine.memory.estimator import _gpt_saves
from engine.memory.ledger import Ledger
from engine.tensor import Tensor, no_grad, set_tape_observer

T_CASES = [1, 5, flash.QUERY_TILE, flash.QUERY_TILE + 1, 2 * flash.KEY_TILE + 7]  # < tile, = tile, across


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


@pytest.fixture(params=["compiled", "numpy"])
def path(request):
    yield from kernel_paths(request)


def forward_backward(q, k, v, g, p=0.0, rng=None):
    tensors = [Tensor(a, requires_grad=True) for a in (q, k, v)]
    out = ops.causal_attention(*tensors, p, rng, training=rng is not None)
    out.backward(g)
    return out.data, [t.grad for t in tensors]


def masked_reference(q, k, v, g, mask, p):
    """Whole-array attention with the probabilities dropped by `mask` and scaled by 1 / (1 - p): output and
    (dq, dk, dv), as engine.reference.causal_attention_backward's chain with the mask in it."""
    a, keep = reference.causal_attention_probs(q, k), mask / (1.0 - p)
    out = (a * keep) @ v
    da = (g @ v.swapaxes(-1, -2)) * keep
    ds = a * (da - (da * a).sum(-1, keepdims=True)) / math.sqrt(q.shape[-1])
    return out, (ds @ k, ds.swapaxes(-1, -2) @ q, (a * keep).swapaxes(-1, -2) @ g)


@pytest.mark.parametrize("t", T_CASES)
@pytest.mark.parametrize("d", [3, 16])
def test_float64_equals_the_reference(path, t, d):
    q, k, v, g = (rand(2, 3, t, d, seed=s) * 2 for s in range(4))
    out, grads = forward_backward(q, k, v, g)
    np.testing.assert_allclose(out, reference.causal_attention(q, k, v), rtol=1e-12, atol=1e-12)
    for got, want in zip(grads, reference.causal_attention_backward(q, k, v, g)):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("t", T_CASES)
@pytest.mark.parametrize("d", [8, 64])
def test_float32_equals_the_reference_to_round_off(t, d):
    q, k, v, g = (rand(2, 2, t, d, seed=s) for s in range(4))
    out, grads = forward_backward(*(a.astype(np.float32) for a in (q, k, v, g)))
    assert out.dtype == np.float32 and all(gr.dtype == np.float32 for gr in grads)
    np.testing.assert_allclose(out, reference.causal_attention(q, k, v), rtol=1e-4, atol=2e-6)
    for got, want in zip(grads, reference.causal_attention_backward(q, k, v, g)):
        # atol on the inputs' scale (1): at T = 1 dq and dk are 0 exactly, up to d's round-off
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-6 * max(1.0, np.abs(want).max()))


def test_a_query_never_sees_a_later_key():
    t = 2 * flash.KEY_TILE + 7
    q, k, v = (rand(1, 2, t, 8, seed=s) for s in range(3))
    out, _ = forward_backward(q, k, v, np.ones_like(q))
    for cut in (1, flash.QUERY_TILE - 1, flash.QUERY_TILE, t - 3):
        later_k, later_v = k.copy(), v.copy()
        later_k[..., cut:, :] += 5.0
        later_v[..., cut:, :] -= 3.0
        changed, _ = forward_backward(q, later_k, later_v, np.ones_like(q))
        np.testing.assert_array_equal(changed[..., :cut, :], out[..., :cut, :])
        assert not np.array_equal(changed[..., cut:, :], out[..., cut:, :])


def test_the_gradients_are_the_derivatives():
    q, k, v = (rand(1, 2, 5, 3, seed=s) for s in range(3))
    g = rand(1, 2, 5, 3, seed=9)
    for p in (0.0, 0.4):
        def attend(*arrays, p=p):  # a fresh rng each call: the same site, so the same mask
            with no_grad():
                tensors = [Tensor(a) for a in arrays]
                return ops.causal_attention(*tensors, p, DropoutRNG(7), training=True).data
        _, grads = forward_backward(q, k, v, g, p, DropoutRNG(7))
        for i, got in enumerate(grads):
            np.testing.assert_allclose(got, numeric_grad(attend, [q, k, v], i, g), rtol=1e-6, atol=1e-8)


def test_a_mask_site_draws_the_slices_of_keep_mask():
    shape, p = (3, 4, 9, 9), 0.3
    rng = DropoutRNG(5)
    rng.begin(step=2, first_row=7)
    whole = rng.keep_mask(shape, p).reshape(3, -1)
    rng.begin(step=2, first_row=7)
    site = rng.mask_site(shape, p)
    assert rng.site == 1  # it takes the site keep_mask would
    for lo, hi, start, stop in [(0, 3, 0, 324), (1, 3, 0, 324), (0, 1, 5, 6), (2, 3, 13, 300),
                                (0, 3, 81, 162), (1, 2, 323, 324), (0, 3, 40, 40)]:
        np.testing.assert_array_equal(site.block(lo, hi, start, stop), whole[lo:hi, start:stop])


@pytest.mark.parametrize("t", [1, flash.QUERY_TILE + 1, 2 * flash.KEY_TILE + 7])
@pytest.mark.parametrize("first_row", [0, 5])
def test_dropout_is_keep_masks_mask_in_forward_and_backward(path, t, first_row):
    """The op's mask is keep_mask's for the same (seed, step, site, rows): what the whole-array op used."""
    p, (b, h, d) = 0.3, (2, 3, 8)
    q, k, v, g = (rand(b, h, t, d, seed=s) for s in range(4))
    rng, mask_rng = DropoutRNG(11), DropoutRNG(11)
    for r in (rng, mask_rng):
        r.begin(step=4, first_row=first_row)
        r.site = 2
    out, grads = forward_backward(q, k, v, g, p, rng)
    mask = mask_rng.keep_mask((b, h, t, t), p)
    assert rng.site == mask_rng.site == 3
    want_out, want_grads = masked_reference(q, k, v, g, mask, p)
    np.testing.assert_allclose(out, want_out, rtol=1e-12, atol=1e-12)
    for got, want in zip(grads, want_grads):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_no_dropout_outside_training():
    q, k, v = (rand(1, 2, 9, 4, seed=s) for s in range(3))
    plain = ops.causal_attention(Tensor(q), Tensor(k), Tensor(v)).data
    rng = DropoutRNG(1)
    evaluating = ops.causal_attention(Tensor(q), Tensor(k), Tensor(v), 0.5, rng, training=False).data
    np.testing.assert_array_equal(plain, evaluating)
    with pytest.raises(ValueError, match="needs an rng"):
        ops.causal_attention(Tensor(q), Tensor(k), Tensor(v), 0.5, None, training=True)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("p", [0.0, 0.2])
def test_16_bit_is_the_float32_computation_rounded(path, dtype, p):
    """Output: the float32 op on the widened inputs, rounded, bit for bit. Gradients: the same up to the one
    difference, d = rowsum(dO O) from the kept (rounded) output, a few 16-bit steps at most."""
    t = flash.QUERY_TILE + 9
    q, k, v, g = (rand(2, 3, t, 16, seed=s).astype(dtype) for s in range(4))

    def run(arrays):
        rng = DropoutRNG(3) if p else None
        return forward_backward(*arrays, p, rng)
    out16, grads16 = run((q, k, v, g))
    out32, grads32 = run([lowp.widen(a) for a in (q, k, v, g)])
    assert out16.dtype == dtype and all(gr.dtype == dtype for gr in grads16)
    np.testing.assert_array_equal(out16.view(np.uint16), lowp.narrow(out32, dtype).view(np.uint16))
    step = float(ml_dtypes.finfo(dtype).eps)
    for got, want in zip(grads16, grads32):
        np.testing.assert_allclose(lowp.widen(got), want, rtol=2 * step, atol=4 * step * np.abs(want).max())


def test_results_do_not_depend_on_the_tiles(monkeypatch):
    q, k, v, g = (rand(2, 2, 150, 8, seed=s) for s in range(4))
    rng = DropoutRNG(2)
    want = forward_backward(q, k, v, g, 0.25, rng)
    for q_tile, k_tile in [(16, 16), (16, 48), (32, 128)]:
        monkeypatch.setattr(flash, "QUERY_TILE", q_tile)
        monkeypatch.setattr(flash, "KEY_TILE", k_tile)
        rng.site = 0
        got = forward_backward(q, k, v, g, 0.25, rng)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-12, atol=1e-13)
        for a, b in zip(got[1], want[1]):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("t", [256, 1024])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_ledger_counts_the_bytes_the_estimator_predicts(t, dropout):
    """A block's attention, as nn.CausalSelfAttention calls it (q, k, v views of one qkv array): what the op
    keeps beyond qkv is the estimator's `attn O` + `attn lse`, to the byte; no [T, T] array, no mask."""
    b, h, c = 1, 6, 384
    qkv = Tensor(rand(b, t, 3 * c).astype(np.float32), requires_grad=True)
    q, k, v = (x.reshape(b, t, h, c // h).transpose(0, 2, 1, 3) for x in ops.split(qkv, 3, axis=-1))
    rng = DropoutRNG(0)
    ledger = Ledger()
    set_tape_observer(ledger)
    try:
        out = ops.causal_attention(q, k, v, dropout, rng, training=True)
        kept = ledger.current["activations"] - qkv.data.nbytes
        out.backward(np.ones(out.shape, np.float32))
        assert ledger.current["activations"] == 0
    finally:
        set_tape_observer(None)
    block = _gpt_saves(b, t, c, h, 50, 1, 8, 4, 4, dropout)[1]
    assert kept == block["attn O 0"] + block["attn lse 0"] == b * t * c * 4 + b * h * t * 4
    assert not any(key.startswith("probs") for key in block)
