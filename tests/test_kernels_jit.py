"""engine.kernels_jit against the NumPy chains it replaces (engine.kernels under compiled.disabled()):
GELU bit for bit; layer norm to float32 rounding (its row sums accumulate in float64 there)."""

import numpy as np
import pytest

from engine import compiled, kernels

pytestmark = pytest.mark.skipif(compiled.load("kernels_jit") is None,
                                reason="numba is not installed: no compiled path to compare")


def test_compiled_gelu_is_the_numpy_chain_bit_for_bit():
    x = (np.random.default_rng(5).standard_normal(2 * kernels.BLOCK + 9) * 3).astype(np.float32)
    g = np.random.default_rng(6).standard_normal(x.size).astype(np.float32)
    fast = kernels.gelu(x), kernels.gelu_backward(x, g)
    with compiled.disabled():
        chain = kernels.gelu(x), kernels.gelu_backward(x, g)
    for a, b in zip(fast, chain):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


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
    """causal_scores and softmax_grad in one pass each: the attention's output and its three gradients
    have the NumPy chain's bits."""
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
