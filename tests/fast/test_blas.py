"""engine.fast.blas.gemm against np.matmul: float64 to 1e-12, float32 within the round-off bound of a k-term
dot product, on the operand views the engine passes (transposed weights, reshaped activations, slices).

Every test runs on each product path this machine has: MKL when the `mkl` extra is installed and on (else
its parameter says "fallback-mkl-not-installed-or-off" and runs NumPy's BLAS), and the fallback, NumPy's BLAS,
always.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from engine.fast import blas

MKL = blas.backend() != "numpy"
PATHS = ["mkl" if MKL else "fallback-mkl-not-installed-or-off", "fallback"]


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    """The product path under test; "fallback" turns MKL off for the test."""
    if request.param == "fallback":
        monkeypatch.setattr(blas, "_library", lambda: None)
    return request.param


def _views(rng, dtype) -> dict:
    """name -> (a, b): the layouts gemm takes as they lie, each a product of shape [m, n]."""
    m, k, n = 37, 53, 29
    x = rng.standard_normal((m, k)).astype(dtype)
    w = rng.standard_normal((n, k)).astype(dtype)  # a Linear's [out, in] weight
    big = rng.standard_normal((3, 80, 70)).astype(dtype)
    return {
        "contiguous": (x, np.ascontiguousarray(w.T)),
        "weight transposed (forward)": (x, w.T),
        "both transposed (gradient of a weight)": (np.ascontiguousarray(x.T).T, w.T),
        "left transposed": (rng.standard_normal((k, m)).astype(dtype).T, np.ascontiguousarray(w.T)),
        "reshaped [B, T, C] -> [B*T, C]": (big.reshape(-1, 70), rng.standard_normal((70, n)).astype(dtype)),
        "row slices": (big[1, 5:5 + m, :k], w.T),
        "column slices (leading dim > cols)": (big[0, :m, 3:3 + k], big[2, :k, 10:10 + n]),
        "transposed column slices": (big[0, :k, 7:7 + m].T, big[1, 2:2 + n, :k].T),
        "one row": (x[:1], w.T),
        "one column": (x, w[:1].T),
        "a column of a transposed matrix": (x[:, 4:5].T, x[:, :7]),
        "vector of ones (a row sum)": (x, np.ones((k, 1), dtype)),
    }


def _fallback_cases(rng) -> dict:
    """Operands gemm hands to np.matmul on every path."""
    a = rng.standard_normal((12, 9)).astype(np.float32)
    b = rng.standard_normal((9, 7)).astype(np.float32)
    return {
        "strided both ways": (a[::2, ::2], b[:5:, ::2]),
        "negative strides": (a[::-1], b[:, ::-1]),
        "broadcast (zero strides)": (np.broadcast_to(a[:1], (12, 9)), b),
        "mixed dtypes": (a.astype(np.float64), b),
        "integers": (np.arange(12).reshape(3, 4), np.arange(8).reshape(4, 2)),
        "batched 3-D": (np.stack([a, a]), b),
        "empty": (a[:0], b),
        "float16": (a.astype(np.float16), b.astype(np.float16)),
    }


def _check_shape(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    assert out.shape == (a.shape[0], b.shape[1])
    assert out.dtype == np.result_type(a.dtype, b.dtype)
    assert out.flags.c_contiguous


@pytest.mark.parametrize("name", list(_views(np.random.default_rng(0), np.float64)))
def test_float64_matches_numpy(path, name):
    a, b = _views(np.random.default_rng(1), np.float64)[name]
    before = (a.copy(), b.copy())
    out = blas.gemm(a, b)
    _check_shape(out, a, b)
    scale = (np.abs(a) @ np.abs(b)).max()
    np.testing.assert_allclose(out, np.matmul(a, b), rtol=0, atol=1e-12 * scale)
    np.testing.assert_array_equal(a, before[0])  # operands are read, never written
    np.testing.assert_array_equal(b, before[1])


@pytest.mark.parametrize("name", list(_views(np.random.default_rng(0), np.float32)))
def test_float32_within_round_off(path, name):
    """|computed - exact| <= k u |a||b| elementwise (u = 2^-24), the bound of a k-term float32 dot product in
    any order; the exact product taken in float64 from the same float32 operands."""
    a, b = _views(np.random.default_rng(2), np.float32)[name]
    out = blas.gemm(a, b)
    _check_shape(out, a, b)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    bound = a.shape[1] * 2.0**-24 * (np.abs(a64) @ np.abs(b64))
    assert np.all(np.abs(out - a64 @ b64) <= bound)


def test_gemm_product_of_the_engine_shapes(path):
    """A GPT layer's three products at a small width, as engine.ops.linear passes them."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 16, 24)).astype(np.float32)
    w = rng.standard_normal((40, 24)).astype(np.float32)
    g = rng.standard_normal((32, 40)).astype(np.float32)
    x2 = x.reshape(-1, 24)
    for a, b in ((x2, w.T), (g, w), (g.T, x2)):
        exact = a.astype(np.float64) @ b.astype(np.float64)
        bound = a.shape[1] * 2.0**-24 * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)))
        assert np.all(np.abs(blas.gemm(a, b) - exact) <= bound)


@pytest.mark.parametrize("name", list(_fallback_cases(np.random.default_rng(0))))
def test_cases_it_does_not_take_are_numpys(path, name):
    a, b = _fallback_cases(np.random.default_rng(4))[name]
    out, ref = blas.gemm(a, b), np.matmul(a, b)
    assert out.dtype == ref.dtype and out.shape == ref.shape
    np.testing.assert_array_equal(out, ref)


def test_out_dtype_casts_the_product(path):
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((6, 5)).astype(np.float32), rng.standard_normal((5, 4)).astype(np.float32)
    same = blas.gemm(a, b, out_dtype=np.float32)
    assert same.dtype == np.float32
    np.testing.assert_array_equal(blas.gemm(a, b, out_dtype=np.float64), same.astype(np.float64))


def test_layout_passes_views_without_copies():
    """The (transpose, leading dimension) each view is handed to CBLAS with, read off its strides."""
    base = np.zeros((10, 12), np.float32)
    assert blas._layout(base) == (blas._NO_TRANS, 12)
    assert blas._layout(base.T) == (blas._TRANS, 12)
    assert blas._layout(base[2:7, 3:9]) == (blas._NO_TRANS, 12)
    assert blas._layout(base[2:7, 3:9].T) == (blas._TRANS, 12)
    assert blas._layout(base[:, :1]) == (blas._NO_TRANS, 12)
    assert blas._layout(base[::2, ::2]) is None
    assert blas._layout(base[::-1]) is None
    assert blas._layout(np.broadcast_to(base[:1], (10, 12))) is None


def test_thread_limits_reach_it(path):
    """engine.comm.cores limits every BLAS through threadpoolctl: MKL's thread count follows (None on
    NumPy's BLAS alone, which threadpoolctl limits directly)."""
    if path != "mkl":
        assert blas.mkl_threads() is None
        return
    before = blas.mkl_threads()
    with threadpool_limits(1):
        assert blas.mkl_threads() == 1
    assert blas.mkl_threads() == before


def test_turned_off_by_the_environment():
    code = "from engine.fast import blas; print(blas.backend())"
    env = {**os.environ, blas.DISABLE_VAR: "0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "numpy"
