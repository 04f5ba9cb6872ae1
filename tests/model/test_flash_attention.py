"""The flash-attention ops (engine.fast.flash): ops.causal_attention_qkv, which nn.CausalSelfAttention runs on
its QKV projection's [B, T, 3C] output, and ops.causal_attention on q, k, v [B, H, T, D]. Forward and the
gradients held to engine.reference's whole-array attention at lengths inside, at and across the tiles and the
key spans; the causal mask; dropout masks that are keep_mask's, drawn tile by tile (DropoutRNG.mask_site);
16-bit inputs computed in float32; results independent of the tiles and of the number of threads; and the
bytes kept, in the ledger and in the estimator."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from numeric_helpers import kernel_paths, numeric_grad, on_threads

from engine import ops, reference
from engine.dropout_rng import DropoutRNG
from engine.dtypes import compute_dtype
from engine.fast import flash, lowp
from engine.memory.estimate_parts import gpt_saves
from engine.memory.ledger import Ledger
from engine.tensor import Parameter, Tensor, no_grad, set_tape_observer

TILE = flash.QUERY_TILE
T_CASES = [1, 5, TILE, TILE + 1, 2 * TILE + 7]  # < tile, = tile, across tiles


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


@pytest.fixture(params=["compiled", "numpy"])
def path(request):
    yield from kernel_paths(request)


@pytest.fixture(params=["qkv", "heads"])
def op(request):
    """Which op: causal_attention_qkv on the projection layout, or causal_attention on [B, H, T, D]."""
    return request.param


def attend(op, q, k, v, g=None, p=0.0, rng=None, training=None):
    """(out, [dq, dk, dv]) of `op` on q, k, v [B, H, T, D], all as [B, H, T, D]; the gradients (None without
    g) for dL/d out = g. Training when an rng is given, unless `training` says otherwise."""
    training = rng is not None if training is None else training
    if op == "heads":
        tensors = [Tensor(a, requires_grad=g is not None) for a in (q, k, v)]
        out = ops.causal_attention(*tensors, p, rng, training=training)
        if g is not None:
            out.backward(g)
        return out.data, [t.grad for t in tensors]
    packed = np.concatenate([reference.merged(a) for a in (q, k, v)], axis=-1)
    qkv = Tensor(packed, requires_grad=g is not None)
    out = ops.causal_attention_qkv(qkv, q.shape[1], p, rng, training=training)
    if g is None:
        return reference.heads(out.data, q.shape[1]), [None] * 3
    out.backward(reference.merged(g))
    return (reference.heads(out.data, q.shape[1]),
            [reference.heads(d, q.shape[1]) for d in np.split(qkv.grad, 3, axis=-1)])


def masked_reference(q, k, v, g, mask, p):
    """Whole-array attention with the probabilities dropped by `mask` and scaled by 1 / (1 - p): output and
    (dq, dk, dv), as engine.reference.causal_attention_backward's chain with the mask in it."""
    a, keep = reference.causal_attention_probs(q, k), mask / (1.0 - p)
    out = (a * keep) @ v
    da = (g @ v.swapaxes(-1, -2)) * keep
    ds = a * (da - (da * a).sum(-1, keepdims=True)) / math.sqrt(q.shape[-1])
    return out, (ds @ k, ds.swapaxes(-1, -2) @ q, (a * keep).swapaxes(-1, -2) @ g)


def assert_close_all(got, want, rtol, atol):
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


@pytest.mark.parametrize("t", T_CASES)
@pytest.mark.parametrize("h, d", [(3, 3), (3, 16), (1, 8)])
def test_float64_equals_the_reference(path, op, t, h, d):
    q, k, v, g = (rand(2, h, t, d, seed=s) * 2 for s in range(4))
    out, grads = attend(op, q, k, v, g)
    np.testing.assert_allclose(out, reference.causal_attention(q, k, v), rtol=1e-12, atol=1e-12)
    assert_close_all(grads, reference.causal_attention_backward(q, k, v, g), 1e-12, 1e-12)


@pytest.mark.parametrize("t", [1, 2 * TILE + 7])
def test_the_fused_op_is_the_reference_on_the_projection_layout(t):
    """[B, T, 3C] in, [B, T, C] out, d qkv [B, T, 3C]: reference.causal_attention_qkv and its backward."""
    n_head, c = 3, 12
    qkv, g = rand(2, t, 3 * c, seed=1), rand(2, t, c, seed=2)
    x = Tensor(qkv, requires_grad=True)
    out = ops.causal_attention_qkv(x, n_head)
    out.backward(g)
    assert out.shape == (2, t, c) and x.grad.shape == qkv.shape
    np.testing.assert_allclose(out.data, reference.causal_attention_qkv(qkv, n_head), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(x.grad, reference.causal_attention_qkv_backward(qkv, n_head, g),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("t, d", [(T_CASES[0], 8), (T_CASES[3], 8), (T_CASES[4], 64), (200, 64)])
def test_float32_equals_the_reference_to_round_off(op, t, d):
    """T = 200 at D = 64 runs past one product's span of keys: the online softmax joins the spans."""
    q, k, v, g = (rand(2, 2, t, d, seed=s) for s in range(4))
    out, grads = attend(op, *(a.astype(np.float32) for a in (q, k, v, g)))
    assert out.dtype == np.float32 and all(gr.dtype == np.float32 for gr in grads)
    np.testing.assert_allclose(out, reference.causal_attention(q, k, v), rtol=1e-4, atol=2e-6)
    for got, want in zip(grads, reference.causal_attention_backward(q, k, v, g)):
        # atol on the inputs' scale (1): at T = 1 dq and dk are 0 exactly, up to d's round-off
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-6 * max(1.0, np.abs(want).max()))


def test_a_query_never_sees_a_later_key(op):
    t = 2 * TILE + 7
    q, k, v = (rand(1, 2, t, 8, seed=s) for s in range(3))
    out, _ = attend(op, q, k, v)
    for cut in (1, TILE - 1, TILE, t - 3):
        later_k, later_v = k.copy(), v.copy()
        later_k[..., cut:, :] += 5.0
        later_v[..., cut:, :] -= 3.0
        changed, _ = attend(op, q, later_k, later_v)
        np.testing.assert_array_equal(changed[..., :cut, :], out[..., :cut, :])
        assert not np.array_equal(changed[..., cut:, :], out[..., cut:, :])


def test_the_gradients_are_the_derivatives(op):
    q, k, v = (rand(1, 2, 5, 3, seed=s) for s in range(3))
    g = rand(1, 2, 5, 3, seed=9)
    for p in (0.0, 0.4):
        def run(*arrays, p=p):  # a fresh rng each call: the same site, so the same mask
            with no_grad():
                return attend(op, *arrays, p=p, rng=DropoutRNG(7))[0]
        _, grads = attend(op, q, k, v, g, p, DropoutRNG(7))
        for i, got in enumerate(grads):
            np.testing.assert_allclose(got, numeric_grad(run, [q, k, v], i, g), rtol=1e-6, atol=1e-8)


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


@pytest.mark.parametrize("t", [1, TILE, TILE + 1, 2 * TILE + 7])
@pytest.mark.parametrize("first_row", [0, 5])
def test_dropout_is_keep_masks_mask_in_forward_and_backward(path, op, t, first_row):
    """The op's mask is keep_mask's for the same (seed, step, site, rows): what the whole-array op used."""
    p, (b, h, d) = 0.3, (2, 3, 8)
    q, k, v, g = (rand(b, h, t, d, seed=s) for s in range(4))
    rng, mask_rng = DropoutRNG(11), DropoutRNG(11)
    for r in (rng, mask_rng):
        r.begin(step=4, first_row=first_row)
        r.site = 2
    out, grads = attend(op, q, k, v, g, p, rng)
    mask = mask_rng.keep_mask((b, h, t, t), p)
    assert rng.site == mask_rng.site == 3
    want_out, want_grads = masked_reference(q, k, v, g, mask, p)
    np.testing.assert_allclose(out, want_out, rtol=1e-12, atol=1e-12)
    assert_close_all(grads, want_grads, 1e-12, 1e-12)


def test_no_dropout_outside_training(op):
    q, k, v = (rand(1, 2, 9, 4, seed=s) for s in range(3))
    plain, _ = attend(op, q, k, v)
    evaluating, _ = attend(op, q, k, v, p=0.5, rng=DropoutRNG(1), training=False)
    np.testing.assert_array_equal(plain, evaluating)
    with pytest.raises(ValueError, match="needs an rng"):
        attend(op, q, k, v, p=0.5, rng=None, training=True)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("p", [0.0, 0.2])
def test_16_bit_is_the_float32_computation_rounded(path, op, dtype, p):
    """Output: the float32 op on the widened inputs, rounded, bit for bit. Gradients: the same up to the one
    difference, d = rowsum(dO O) from the kept (rounded) output, a few 16-bit steps at most."""
    t = TILE + 9
    q, k, v, g = (rand(2, 3, t, 16, seed=s).astype(dtype) for s in range(4))

    def run(arrays):
        return attend(op, *arrays, p=p, rng=DropoutRNG(3) if p else None)
    out16, grads16 = run((q, k, v, g))
    out32, grads32 = run([lowp.widen(a) for a in (q, k, v, g)])
    assert out16.dtype == dtype and all(gr.dtype == dtype for gr in grads16)
    np.testing.assert_array_equal(out16.view(np.uint16), lowp.narrow(out32, dtype).view(np.uint16))
    step = float(ml_dtypes.finfo(dtype).eps)
    for got, want in zip(grads16, grads32):
        np.testing.assert_allclose(lowp.widen(got), want, rtol=2 * step, atol=4 * step * np.abs(want).max())


@pytest.mark.parametrize("tile, span, group_bytes", [(16, 16, 1), (16, 48, 1 << 20), (32, 128, 64 << 10)])
def test_results_do_not_depend_on_the_tiles(op, monkeypatch, tile, span, group_bytes):
    """Other query tiles, key spans (several per row: the online softmax) and groups of heads."""
    q, k, v, g = (rand(2, 3, 150, 8, seed=s) for s in range(4))
    rng = DropoutRNG(2)
    want = attend(op, q, k, v, g, 0.25, rng)
    monkeypatch.setattr(flash, "QUERY_TILE", tile)
    monkeypatch.setattr(flash, "SMALL_PRODUCT", tile * span * 8)
    monkeypatch.setattr(flash, "GROUP_BYTES", group_bytes)
    assert flash._key_span(8) == span
    rng.site = 0
    got = attend(op, q, k, v, g, 0.25, rng)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12, atol=1e-13)
    assert_close_all(got[1], want[1], 1e-12, 1e-13)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("p", [0.0, 0.2])
def test_the_fused_op_gives_one_threads_bits_on_any_number(monkeypatch, dtype, p):
    """Shares cut inside batch rows (5 heads a row) and groups of two heads: the same bits on 1, 2 and 3."""
    t = TILE + 5
    monkeypatch.setattr(ops, "ATTENTION_SHARE_MACS", 1)
    monkeypatch.setattr(flash, "GROUP_BYTES", 2 * t * 8 * compute_dtype(dtype).itemsize)
    assert flash._group_heads(t, 8, compute_dtype(dtype)) == 2
    qkv, g = rand(3, t, 3 * 5 * 8, seed=1).astype(dtype), rand(3, t, 5 * 8, seed=2).astype(dtype)

    def run():
        x = Tensor(qkv, requires_grad=True)
        y = ops.causal_attention_qkv(x, 5, p, DropoutRNG(4) if p else None, training=True)
        y.backward(g)
        return y.data.tobytes(), x.grad.tobytes()
    one = on_threads(1, run)
    for threads in (2, 3):
        assert on_threads(threads, run) == one


def test_a_slice_of_whole_heads_gives_those_heads_outputs():
    """Heads never mix: the op on heads [2, 5) of each of q, k, v (a tensor-parallel rank's [B, T, 3C/t], with
    its own head count) gives exactly those heads' columns of the whole op's output and gradient."""
    n_head, d, t = 6, 4, TILE + 3
    qkv, g = rand(2, t, 3 * n_head * d, seed=3), rand(2, t, n_head * d, seed=4)
    x = Tensor(qkv, requires_grad=True)
    ops.causal_attention_qkv(x, n_head).backward(g)
    cols = slice(2 * d, 5 * d)
    part = np.concatenate([qkv[..., i * n_head * d:][..., cols] for i in range(3)], axis=-1)
    xs = Tensor(part, requires_grad=True)
    ys = ops.causal_attention_qkv(xs, 3)
    ys.backward(g[..., cols])
    np.testing.assert_array_equal(ys.data, ops.causal_attention_qkv(Tensor(qkv), n_head).data[..., cols])
    for i, dpart in enumerate(np.split(xs.grad, 3, axis=-1)):
        np.testing.assert_array_equal(dpart, x.grad[..., i * n_head * d:][..., cols])


def test_the_fused_op_refuses_a_width_that_is_not_three_times_its_heads():
    with pytest.raises(ValueError, match="3 x 4 heads"):
        ops.causal_attention_qkv(Tensor(rand(1, 3, 30)), 4)


@pytest.mark.parametrize("t", [256, 1024])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_ledger_counts_the_bytes_the_estimator_predicts(t, dropout):
    """A block's attention as nn.CausalSelfAttention runs it: what attention and c_proj keep beyond qkv is the
    estimator's `attn O` + `attn lse`, to the byte (the output is c_proj's input: one array); no [T, T]
    array, no mask."""
    b, h, c = 1, 6, 384
    qkv = Tensor(rand(b, t, 3 * c).astype(np.float32), requires_grad=True)
    c_proj = Parameter(rand(c, c).astype(np.float32))
    rng = DropoutRNG(0)
    ledger = Ledger()
    set_tape_observer(ledger)
    try:
        out = ops.linear(ops.causal_attention_qkv(qkv, h, dropout, rng, training=True), c_proj)
        kept = ledger.current["activations"] - qkv.data.nbytes
        out.backward(np.ones(out.shape, np.float32))
        assert ledger.current["activations"] == 0
    finally:
        set_tape_observer(None)
    block = gpt_saves(b, t, c, h, 50, 1, 8, 4, 4, dropout)[1]
    assert kept == block["attn O 0"] + block["attn lse 0"] == b * t * c * 4 + b * h * t * 4
    assert not any(key.startswith(("probs", "attn out")) for key in block)
