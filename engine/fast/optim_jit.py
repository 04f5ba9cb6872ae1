"""The gradient norm's sum of squares as a compiled loop (numba): engine.optim's fast path.

Why compiled: NumPy's sum of squares in float64 is a widening copy into a float64 buffer and a dot, three
trips through memory where one read of the gradients will do. The loop accumulates in float64, block by
block, each block's sum in the CPU's vector lanes, so it agrees with the NumPy path to float64 rounding,
not bit for bit. The lanes' order is the compiler's choice for the CPU: every rank on one kind of CPU gets
the same bits (each DDP rank computes the norm of the same all-reduced gradients on its own), and ranks on
CPUs with different vector widths may differ in the last bit of the norm, as PyTorch's vectorised norms do.
"""

from __future__ import annotations

import numpy as np
from numba import njit

SUM_BLOCK = 1024  # elements per block of sum_of_squares


@njit(cache=True, nogil=True, fastmath={"reassoc"})
def _block_sum(block):  # pragma: no cover - compiled
    """The sum of squares of one block in float64. Reassociation (only that: infinities and NaNs still
    propagate) lets LLVM keep the running sum in vector lanes: ~10x one scalar sum's speed."""
    total = 0.0
    for i in range(block.size):  # (not `for value in block`: LLVM leaves that loop scalar)
        wide = np.float64(block[i])
        total += wide * wide
    return total


@njit(cache=True, nogil=True)
def sum_of_squares(x):  # pragma: no cover - compiled
    """The sum of x's squares in float64: blocks of SUM_BLOCK elements, each summed in vector lanes, the
    blocks' sums added in order (its rounding error grows with the block and the number of blocks, not
    with x's length as one running sum's would)."""
    total = 0.0
    for start in range(0, x.size, SUM_BLOCK):
        total += _block_sum(x[start:start + SUM_BLOCK])
    return total
