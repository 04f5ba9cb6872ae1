"""engine.fast.kernels_jit against the NumPy chains it replaces (engine.fast.kernels under
compiled.disabled()) and against float64: GELU and layer norm to float32 rounding (GELU's exp is its own
polynomial, layer norm's row sums accumulate in float64); the fused 16-bit loops bit for bit against the
float32 loops rounded once."""

import ml_dtypes
import numpy as np
import pytest
from numba import njit

from engine import reference
from engine.fast import compiled, kernels, lowp

pytestmark = pytest.mark.skipif(compiled.load("kernels_jit") is None,
                                reason="numba is not installed: no compiled path to compare")
ULP = 2.0 ** -23  # float32's unit in the last place at 1


def test_the_vectorised_exp_is_within_two_units_in_the_last_place():
    from engine.fast import kernels_jit

    @njit
    def exp_all(v, out):
        for i in range(v.size):
            out[i] = kernels_jit._exp(v[i])
    v = np.concatenate([np.linspace(-87, 87, 2_000_003, dtype=np.float32),
                        np.float32([0, -0.0, 1e-30, -1e-30, 0.34657359, -0.34657359])])
    out = np.empty_like(v)
    exp_all(v, out)
    exact = np.exp(v.astype(np.float64))
    assert np.max(np.abs(out - exact) / exact) < 2 * ULP / 2  # within 2 units of 2^-24 relative
    exp_all(np.float32([np.nan, 100, -100, np.inf, -np.inf, 87]), out[:6])
    assert np.isnan(out[0])
    np.testing.assert_array_equal(out[1:5], [out[5], 0, out[5], 0])  # exp(87) above 87, 0 below -87


def _gelu_float64(x: np.ndarray):
    """(gelu, its two gradient terms, the exp's argument) in float64, in the sigmoid form: engine.reference's
    formula loses all of its digits where x is very negative, even in float64."""
    v = 2 * reference.GELU_C * (x + reference.GELU_K * x ** 3)
    with np.errstate(over="ignore"):
        s = 1 / (1 + np.exp(-v))
    slope = reference.GELU_C * (1 + 3 * reference.GELU_K * x * x)
    return x * s, s, 2 * x * slope * (1 - s) * s, v


@pytest.mark.parametrize("n", [1, 7, kernels.SHARE_GRAIN * 2 + 13])
def test_compiled_gelu_is_float64_gelu_to_float32_rounding(n):
    """Within 4 float32 rounding units of the exact GELU and gradient, scaled by how much float32 x itself
    can move them (exp's argument v: a relative error of v is v's absolute error in exp(v)); past float32's
    range, 1e-32."""
    rng = np.random.default_rng(n)
    x = np.concatenate([(rng.standard_normal(n) * 4), np.linspace(-30, 30, 10_007)]).astype(np.float32)
    g = rng.standard_normal(x.size).astype(np.float32)
    y, s, t, v = _gelu_float64(x.astype(np.float64))
    unit = 4 * 2.0 ** -24 * (1 + np.abs(v))
    dy = kernels.gelu_backward(x, g)
    assert kernels.gelu(x).dtype == dy.dtype == np.float32
    assert np.all(np.abs(kernels.gelu(x) - y) <= unit * np.abs(y) + 1e-32)
    assert np.all(np.abs(dy - g * (s + t)) <= unit * np.abs(g) * (np.abs(s) + np.abs(t)) + 1e-32)


def test_compiled_gelu_is_the_numpy_chain_to_float32_rounding():
    x = (np.random.default_rng(5).standard_normal(2 * kernels.BLOCK + 9) * 3).astype(np.float32)
    g = np.random.default_rng(6).standard_normal(x.size).astype(np.float32)
    fast = kernels.gelu(x), kernels.gelu_backward(x, g)
    with compiled.disabled():
        chain = kernels.gelu(x), kernels.gelu_backward(x, g)
    for a, c in zip(fast, chain):
        np.testing.assert_allclose(a, c, rtol=0, atol=1e-6 * float(np.abs(c).max()))


def test_compiled_gelu_at_the_ends_of_float32():
    x = np.float32([np.nan, np.inf, 0.0, -0.0, 1e-30, 3e38, 1e15, -1e4, -20.0])
    y, dy = kernels.gelu(x), kernels.gelu_backward(x, np.ones_like(x))
    assert np.isnan(y[0]) and np.isnan(dy[0]) and y[1] == np.inf
    same = [2, 3, 5, 6]  # 0, -0 and x where gelu(x) rounds to x
    np.testing.assert_array_equal(y[same].view(np.uint32), x[same].view(np.uint32))
    assert y[4] == np.float32(5e-31)
    np.testing.assert_array_equal(dy[[2, 3, 4, 6]], [0.5, 0.5, 0.5, 1])  # (at 3e38 x^2 overflows: NaN)
    assert np.all(np.abs(y[7:]) < 1e-30) and np.all(np.abs(dy[7:]) < 1e-20)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_fused_16_bit_gelu_is_float32_gelu_rounded_once_bit_for_bit(dtype):
    """The fused loops read and write 16-bit bits directly; they must give what widening, the float32
    kernel and one rounding give: every element, specials included (inf, nan, overflow, subnormals)."""
    rng = np.random.default_rng(8)
    x = (rng.standard_normal(2 * kernels.BLOCK + 9) * 4).astype(np.float32)
    x[:6] = [np.inf, -np.inf, np.nan, 3e38 if dtype != np.float16 else 6e4, 1e-7, -0.0]
    g = (rng.standard_normal(x.size) * 100).astype(np.float32)
    x16, g16 = x.astype(dtype), g.astype(dtype)
    assert kernels._route((x16, g16), ())[0] == "fused16" or dtype == np.float16
    with np.errstate(over="ignore", invalid="ignore"):
        fused = kernels.gelu(x16), kernels.gelu_backward(x16, g16)
        wide = (kernels.gelu(x16.astype(np.float32)),
                kernels.gelu_backward(x16.astype(np.float32), g16.astype(np.float32)))
    for a, w in zip(fused, wide):  # (a NaN's sign is the compiler's choice, as IEEE leaves it)
        assert a.dtype == dtype
        nan = np.isnan(a.astype(np.float32))
        np.testing.assert_array_equal(nan, np.isnan(w))
        np.testing.assert_array_equal(a.view(np.uint16)[~nan], lowp.narrow(w, dtype).view(np.uint16)[~nan])


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
def test_fused_16_bit_layer_norm_is_float32_layer_norm_rounded_once_bit_for_bit(dtype, bias):
    rng = np.random.default_rng(9)
    rows, n = 3 * (kernels.BLOCK // 130) + 5, 130
    x, g = ((rng.standard_normal((rows, n)) * 3 + 1).astype(dtype) for _ in range(2))
    w, b = (rng.standard_normal(n).astype(dtype) for _ in range(2))
    b = b if bias else None
    y, mu, rstd = kernels.layer_norm(x, w, b, 1e-5)
    dx, dw, db = kernels.layer_norm_backward(x, w, mu, rstd, g)
    x32, g32 = x.astype(np.float32), g.astype(np.float32)
    y32, mu32, rstd32 = kernels.layer_norm(x32, w, b, 1e-5)
    dx32, dw32, db32 = kernels.layer_norm_backward(x32, w, mu32, rstd32, g32)
    for fused, wide in ((y, y32), (dx, dx32)):
        assert fused.dtype == dtype
        np.testing.assert_array_equal(fused.view(np.uint16), lowp.narrow(wide, dtype).view(np.uint16))
    for fused, wide in ((mu, mu32), (rstd, rstd32), (dw, dw32), (db, db32)):
        np.testing.assert_array_equal(fused.view(np.uint32), wide.view(np.uint32))


@pytest.mark.parametrize("bias", [True, False])
def test_compiled_layer_norm_is_the_numpy_chain_to_float32_rounding(bias):
    rng = np.random.default_rng(7)
    rows, n = 3 * (kernels.BLOCK // 130) + 5, 130  # a row length that is not a multiple of 4
    x, g = ((rng.standard_normal((rows, n)) * 3 + 1).astype(np.float32) for _ in range(2))
    w, b = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    fast = kernels.layer_norm(x, w, b if bias else None, 1e-5)
    fast += kernels.layer_norm_backward(x, w, fast[1], fast[2], g)
    with compiled.disabled():
        chain = kernels.layer_norm(x, w, b if bias else None, 1e-5)
        chain += kernels.layer_norm_backward(x, w, chain[1], chain[2], g)
    for a, c in zip(fast, chain):
        assert a.dtype == c.dtype and a.shape == c.shape
        np.testing.assert_allclose(a, c, rtol=2e-6, atol=2e-6 * float(np.abs(c).max()))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_compiled_attention_softmax_is_the_numpy_chain_bit_for_bit(dtype):
    """The fused attention's compiled tile loops (engine.fast.flash_jit): its output and its three gradients
    have the NumPy path's bits."""
    from engine import ops
    from engine.tensor import Tensor

    def run() -> list[np.ndarray]:
        rng = np.random.default_rng(8)
        q, k, v = (Tensor((rng.standard_normal((3, 2, 16, 8)) * 2).astype(dtype), requires_grad=True)
                   for _ in range(3))
        out = ops.causal_attention(q, k, v)
        out.backward(rng.standard_normal(out.shape).astype(dtype))
        return [out.data, q.grad, k.grad, v.grad]
    fast = run()
    with compiled.disabled():
        chain = run()
    for a, b in zip(fast, chain):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
