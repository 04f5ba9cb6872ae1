"""engine.fast.lowp: 16-bit arithmetic in float32 gives NumPy's own bits."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from engine.fast import lowp


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_add_is_numpys_16_bit_add_bit_for_bit(dtype):
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 1 << 16, size=(2, 50_000), dtype=np.uint32).astype(np.uint16)
    a, b = bits.view(dtype)  # every kind of value: subnormals, overflow to inf, infinities, NaNs
    with np.errstate(all="ignore"):  # inf - inf: NaN, as in NumPy
        want = a + b
        got = lowp.add(a, b)
        out = a.copy()
        lowp.add(out, b, out=out)
    # NaN payloads aside
    same = (got.view(np.uint16) == want.view(np.uint16)) | (np.isnan(got) & np.isnan(want))
    assert got.dtype == want.dtype and same.all()
    assert np.array_equal(out.view(np.uint16), got.view(np.uint16))


def test_float32_and_float64_pass_through():
    x = np.arange(5, dtype=np.float32)
    assert lowp.widen(x) is x and lowp.narrow(x, np.float32) is x
    np.testing.assert_array_equal(lowp.add(x, x), 2 * x)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_conversions_shared_among_threads_give_the_same_bits(dtype):
    from engine.fast import thread_pool
    x = np.random.default_rng(1).standard_normal((17, thread_pool.BLOCK + 17)).astype(np.float32) * 1e3
    before = thread_pool.threads()
    try:
        thread_pool.set_threads(2)
        half = lowp.narrow(x, dtype)
        back = lowp.widen(half)
    finally:
        thread_pool.set_threads(before)
    assert np.array_equal(half.view(np.uint16), x.astype(dtype).view(np.uint16))
    assert np.array_equal(back, half.astype(np.float32))
