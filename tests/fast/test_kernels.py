"""engine.fast.kernels: block by block and shared among threads, the same results as whole-array NumPy
(engine.reference); every test on both paths (the compiled loops of engine.fast.kernels_jit, skipped only
where numba is missing, and NumPy's chains)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from numeric_helpers import kernel_paths

from engine import reference
from engine.fast import kernels, lowp, thread_pool

_route = kernels._route


@pytest.fixture(params=["compiled", "numpy"], autouse=True)
def path(request):
    yield from kernel_paths(request)


@pytest.fixture(params=[1, 2], ids=["1 thread", "2 threads"])
def threads(request):
    before = thread_pool.threads()
    thread_pool.set_threads(request.param)
    yield request.param
    thread_pool.set_threads(before)


@pytest.mark.parametrize("n", [7, kernels.BLOCK, 3 * kernels.BLOCK + 5])
def test_gelu_and_its_gradient_match_the_formula(threads, n):
    x = np.random.default_rng(n).standard_normal(n) * 3
    g = np.random.default_rng(n + 1).standard_normal(n)
    np.testing.assert_allclose(kernels.gelu(x), reference.gelu(x), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(kernels.gelu_backward(x, g), reference.gelu_backward(x, g),
                               rtol=1e-12, atol=1e-14)


def _every_kernel(x: np.ndarray, rows: int) -> list[np.ndarray]:
    """GELU and its gradient on x, layer norm (with and without a bias) and its gradients on x's first
    rows x rows elements as rows of n."""
    flat = x.reshape(-1)
    out = [kernels.gelu(x), kernels.gelu_backward(x, x[::-1].copy())]
    xs = flat[:flat.size // rows * rows].reshape(rows, -1)
    w = np.linspace(0.5, 1.5, xs.shape[1]).astype(np.float32)
    for b in (w[::-1].copy(), None):
        y, mu, rstd = kernels.layer_norm(xs, w, b, 1e-5)
        out += [y, mu, rstd, *kernels.layer_norm_backward(xs, w, mu, rstd, xs[::-1].copy())]
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, ml_dtypes.bfloat16])
def test_blocks_and_threads_do_not_change_a_bit(threads, dtype, monkeypatch):
    """Sizes that are multiples of no block nor share (3 blocks and a bit of elements; 777 rows of 126),
    shared from a small size on (the compiled loops' ranges start anywhere)."""
    monkeypatch.setattr(kernels, "SHARE_GRAIN", 1000)
    x = (np.random.default_rng(0).standard_normal(3 * kernels.BLOCK + 5) * 2).astype(dtype)
    thread_pool.set_threads(1)
    one = _every_kernel(x, 777)
    thread_pool.set_threads(threads)
    many = _every_kernel(x, 777)
    for a, b in zip(one, many):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.parametrize("path", ["compiled"], indirect=True)  # the widened route is a compiled one
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_16_bit_blocks_widened_around_the_float32_loops_give_the_fused_loops_bits(monkeypatch, dtype):
    """Where the fused 16-bit loops cannot read halves (a CPU without F16C), blocks are widened, run
    through the float32 loops and rounded: the same bits (NaNs aside)."""
    x = (np.random.default_rng(3).standard_normal(2 * kernels.BLOCK + 7) * 3).astype(dtype)
    fused = _every_kernel(x, 301)
    monkeypatch.setattr(kernels, "_route", lambda arrays, compiled: (
        ("widened", *_route(arrays, compiled)[1:]) if arrays[0].dtype == dtype else _route(arrays, compiled)))
    widened = _every_kernel(x, 301)
    for a, b in zip(fused, widened):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


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
    ref_y, ref_mu, ref_rstd = reference.layer_norm(x, w, b, 1e-5)
    np.testing.assert_allclose(y, ref_y, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(mu, ref_mu, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(rstd, ref_rstd, rtol=1e-12)
    dx, dw, db = kernels.layer_norm_backward(x, w, mu, rstd, g)
    ref_dx, ref_dw, ref_db = reference.layer_norm_backward(x, w, g, 1e-5)
    np.testing.assert_allclose(dx, ref_dx, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(dw, ref_dw, rtol=1e-10)
    np.testing.assert_allclose(db, ref_db, rtol=1e-10)

