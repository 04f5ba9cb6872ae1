"""engine.fast.kernels_jit against the NumPy chains it replaces (engine.fast.kernels under
compiled.disabled()):
GELU bit for bit; layer norm to float32 rounding (its row sums accumulate in vector lanes there)."""

import ml_dtypes
import numpy as np
import pytest

from engine.fast import compiled, kernels, lowp

pytestmark = pytest.mark.skipif(compiled.load("kernels_jit") is None,
                                reason="numba is not installed: no compiled path to compare")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_compiled_gelu_is_the_numpy_chain_bit_for_bit(dtype):
    x = (np.random.default_rng(5).standard_normal(2 * kernels.BLOCK + 9) * 3).astype(dtype)
    x[:8] = [np.inf, -np.inf, np.nan, 3e38, -3e38, 1e-7, -0.0, 0.0]  # tanh clamped, overflowed, signed zeros
    g = np.random.default_rng(6).standard_normal(x.size).astype(dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        fast = kernels.gelu(x), kernels.gelu_backward(x, g)
        with compiled.disabled():
            chain = kernels.gelu(x), kernels.gelu_backward(x, g)
    for a, b in zip(fast, chain):
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


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
    for a, w in zip(fused, wide):
        assert a.dtype == dtype
        np.testing.assert_array_equal(a.view(np.uint16), lowp.narrow(w, dtype).view(np.uint16))


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
