"""engine.fast.tanh32, GELU's float32 tanh, against float64's np.tanh: within 6 ulp over float32's range
(sampled densely), odd, bounded by 1, with the specials kept; the compiled tanh32 gives its bits."""

import numpy as np
import pytest

from engine.fast import compiled
from engine.fast.tanh32 import CLAMP, coefficients, tanh_numpy


def _float32s_between(lo: float, hi: float, every: int) -> np.ndarray:
    """Every `every`-th float32 in [lo, hi), by bit pattern."""
    a, b = (int(np.float32(v).view(np.uint32)) for v in (lo, hi))
    return np.arange(a, b, every, dtype=np.uint32).view(np.float32)


def _ulps(u: np.ndarray) -> np.ndarray:
    exact = np.tanh(u.astype(np.float64))
    return np.abs(tanh_numpy(u.copy()) - exact) / np.spacing(exact.astype(np.float32)).astype(np.float64)


def test_within_6_ulp_of_tanh_from_the_smallest_normal_to_past_the_clamp():
    u = _float32s_between(1.2e-38, 12.0, every=211)  # ~5 million floats, every binade
    errors = _ulps(u)
    assert errors.max() <= 6.0, (errors.max(), u[errors.argmax()])
    assert errors.mean() <= 1.5


def test_odd_bounded_by_one_and_its_specials():
    u = np.concatenate([_float32s_between(1e-30, 40.0, every=4099), [CLAMP, np.float32(CLAMP) * 2, 3e38]])
    u = u.astype(np.float32)
    t = tanh_numpy(u.copy())
    np.testing.assert_array_equal(tanh_numpy(-u), -t)
    assert np.all(np.abs(t) <= 1.0) and np.all(t[u >= CLAMP] == 1.0)
    specials = tanh_numpy(np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-45], np.float32))
    np.testing.assert_array_equal(specials[:2], [1.0, -1.0])
    assert np.isnan(specials[2]) and np.signbit(specials[4]) and not np.signbit(specials[3])
    assert specials[5] > 0  # a subnormal's tanh is itself, to rounding, not 0


@pytest.mark.skipif(compiled.load("kernels_jit") is None, reason="numba is not installed: no compiled tanh32")
def test_the_compiled_tanh_gives_the_numpy_chains_bits():
    jit, k = compiled.load("kernels_jit"), coefficients()
    u = np.concatenate([_float32s_between(1e-30, 12.0, every=1 << 19), [np.inf, np.nan, 0.0, CLAMP]])
    u = np.concatenate([u, -u]).astype(np.float32)
    loop = np.array([jit.tanh32(v, k) for v in u], np.float32)
    np.testing.assert_array_equal(loop.view(np.uint32), tanh_numpy(u.copy()).view(np.uint32))
