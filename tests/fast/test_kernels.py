"""engine.fast.kernels: block by block and shared among threads, the same results as whole-array NumPy; every
test on both paths (the compiled loops of engine.fast.kernels_jit, skipped only where numba is missing, and
NumPy's chains)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from engine.fast import compiled, kernels, lowp, thread_pool

C, K = math.sqrt(2.0 / math.pi), 0.044715


@pytest.fixture(params=["compiled", "numpy"], autouse=True)
def path(request):
    if request.param == "numpy":
        with compiled.disabled():
            yield request.param
        return
    if compiled.load("kernels_jit") is None:
        pytest.skip("numba is not installed: the compiled path is not available")
    yield request.param


@pytest.fixture(params=[1, 2], ids=["1 thread", "2 threads"])
def threads(request):
    before = thread_pool.threads()
    thread_pool.set_threads(request.param)
    yield request.param
    thread_pool.set_threads(before)


def whole_array_gelu(x):
    t = np.tanh(C * (x + K * x * x * x))
    return 0.5 * x * (1 + t), t


@pytest.mark.parametrize("n", [7, kernels.BLOCK, 3 * kernels.BLOCK + 5])
def test_gelu_and_its_gradient_match_the_formula(threads, n):
    x = np.random.default_rng(n).standard_normal(n) * 3
    g = np.random.default_rng(n + 1).standard_normal(n)
    y, t = whole_array_gelu(x)
    np.testing.assert_allclose(kernels.gelu(x), y, rtol=1e-12, atol=1e-14)
    slope = C * (1 + 3 * K * x * x)
    expected = g * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * slope)
    np.testing.assert_allclose(kernels.gelu_backward(x, g), expected, rtol=1e-12, atol=1e-14)


def test_blocks_and_threads_do_not_change_a_bit(threads):
    x = np.random.default_rng(0).standard_normal(3 * kernels.BLOCK + 5).astype(np.float32)
    thread_pool.set_threads(1)
    one = kernels.gelu(x), kernels.gelu_backward(x, x)
    thread_pool.set_threads(threads)
    many = kernels.gelu(x), kernels.gelu_backward(x, x)
    for a, b in zip(one, many):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_16_bit_kernels_compute_in_float32_and_round_once(dtype):
    x = (np.random.default_rng(1).standard_normal(2 * kernels.BLOCK + 3) * 2).astype(dtype)
    x32 = x.astype(np.float32)
    y32 = kernels.gelu(x32)
    np.testing.assert_array_equal(kernels.gelu(x).view(np.uint16), lowp.narrow(y32, dtype).view(np.uint16))


def test_layer_norm_and_its_gradients_match_float64(threads):
    rng = np.random.default_rng(2)
    rows, n = 3 * (kernels.BLOCK // 48) + 7, 48  # several blocks of rows, the last one partial
    x, w, b, g = (rng.standard_normal(s) for s in ((rows, n), n, n, (rows, n)))
    y, mu, rstd = kernels.layer_norm(x, w, b, 1e-5)
    ref_mu = x.mean(1, keepdims=True)
    ref_rstd = 1 / np.sqrt(x.var(1, keepdims=True) + 1e-5)
    xhat = (x - ref_mu) * ref_rstd
    np.testing.assert_allclose(y, xhat * w + b, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(rstd, ref_rstd, rtol=1e-12)
    dx, dw, db = kernels.layer_norm_backward(x, w, mu, rstd, g)
    dxhat = g * w
    ref_dx = ref_rstd * (dxhat - dxhat.mean(1, keepdims=True) - xhat * (dxhat * xhat).mean(1, keepdims=True))
    np.testing.assert_allclose(dx, ref_dx, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(dw, (g * xhat).sum(0), rtol=1e-10)
    np.testing.assert_allclose(db, g.sum(0), rtol=1e-10)

