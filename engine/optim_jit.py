"""The gradient norm's sum of squares as a compiled loop (numba): engine.optim's fast path.

Why compiled: NumPy's sum of squares in float64 is a widening copy into a float64 buffer and a dot, three
trips through memory where one read of the gradients will do. The loop accumulates in float64 in
blocks of eight interleaved partial sums (the additions can then overlap; numba keeps their order, it does
not reassociate), so it agrees with the NumPy path to float64 rounding, not bit for bit.
"""

from __future__ import annotations

import numpy as np
from numba import njit

SUM_BLOCK = 1024  # elements per block of sum_of_squares


@njit(cache=True, nogil=True, inline="always")
def _sq(value):  # pragma: no cover - compiled
    """value squared in float64 (exact for a float32 value)."""
    wide = np.float64(value)
    return wide * wide


@njit(cache=True, nogil=True)
def sum_of_squares(x):  # pragma: no cover - compiled
    """The sum of x's squares in float64: blocks of SUM_BLOCK elements, each in eight interleaved partial
    sums, the blocks' sums added up (its rounding error grows with the block and the number of blocks,
    not with x's length as one running sum's would)."""
    total = 0.0
    for start in range(0, x.size, SUM_BLOCK):
        end = min(start + SUM_BLOCK, x.size)
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 0.0
        n = start + (end - start) // 8 * 8
        for i in range(start, n, 8):
            a0 += _sq(x[i])
            a1 += _sq(x[i + 1])
            a2 += _sq(x[i + 2])
            a3 += _sq(x[i + 3])
            a4 += _sq(x[i + 4])
            a5 += _sq(x[i + 5])
            a6 += _sq(x[i + 6])
            a7 += _sq(x[i + 7])
        for i in range(n, end):
            a0 += _sq(x[i])
        total += ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))
    return total
