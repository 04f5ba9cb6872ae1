"""16-bit arithmetic done in float32: widen exactly, compute, round once.

NumPy's own float16 arithmetic (and ml_dtypes' bfloat16) computes each element in float32 and rounds
it back, one element at a time, at ~5-10 ns per element; float32 arithmetic runs at memory speed.
Doing the same float32 arithmetic on exactly widened operands and rounding the result once gives the
same bits (float32 holds every 16-bit value exactly, and one rounding of the float32 result is what
NumPy does per element), so `add` here equals `a + b` bit for bit (NaN payloads aside), faster. Fused ops
go further, as matrix units and fused GPU kernels do: they keep a whole computation in float32 and
round only what they return.

float16 <-> float32 goes through engine.halfconv; bfloat16 through ml_dtypes' own casts (already
vectorised: a 16-bit shift up, round-to-nearest-even down). float32 and float64 pass through untouched.
"""

from __future__ import annotations

import numpy as np

from engine import blocks, halfconv
from engine.dtypes import LOW_PRECISION


def widen(a: np.ndarray) -> np.ndarray:
    """`a` in its compute dtype: 16-bit floats exactly as float32; anything else as it is (no copy)."""
    return _convert(a, np.dtype(np.float32)) if a.dtype in LOW_PRECISION else a


def narrow(x: np.ndarray, dtype) -> np.ndarray:
    """`x` rounded to `dtype` (to nearest, ties to even; overflow to inf without a warning); no copy
    when it already has it."""
    dtype = np.dtype(dtype)
    if x.dtype == dtype:
        return x
    with np.errstate(over="ignore"):
        return _convert(x, dtype)


def _convert(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """a.astype(dtype) through engine.halfconv; a large contiguous array in blocks shared among the
    rank's threads (engine.blocks), since a conversion costs about as much as a matrix product's
    share of the step in 16-bit training."""
    if blocks.threads() == 1 or a.size < 2 * blocks.BLOCK or not a.flags.c_contiguous:
        return halfconv.astype(a, dtype)
    out = np.empty(a.shape, dtype)
    src, dst = a.reshape(-1), out.reshape(-1)

    def block(lo: int, hi: int) -> None:
        with np.errstate(over="ignore"):  # the thread's own error state
            dst[lo:hi] = halfconv.astype(src[lo:hi], dtype)
    blocks.run(block, src.size, 4 * blocks.BLOCK)
    return out


def add(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """a + b (into `out` when given), bit for bit NumPy's result; any 16-bit operand or `out` is
    computed in float32 (a float16 + float32 sum is float32, as in NumPy)."""
    dtypes = (a.dtype, b.dtype) if out is None else (a.dtype, b.dtype, out.dtype)
    if not any(d in LOW_PRECISION for d in dtypes):
        return np.add(a, b, out=out)
    wide = widen(a) + widen(b)
    if out is None:
        return narrow(wide, np.result_type(a.dtype, b.dtype))
    out[...] = narrow(wide, out.dtype)
    return out
