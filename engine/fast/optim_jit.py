"""The optimizer's compiled loops (numba): engine.optim's fast paths.

AdamW's update (`adamw`): NumPy's version is fourteen passes over the parameters, gradients and moments,
chunk by chunk; one loop reads each of p, g, m, v once and writes p, m, v once. It does NumPy's operations
in NumPy's order, each a plain IEEE one (no fused multiply-adds), with the same constants rounded to the
arrays' dtype, so its results are NumPy's bit for bit.

The gradient norm's sum of squares (`sum_of_squares`). Why compiled: NumPy's sum of squares in float64 is
a widening copy into a float64 buffer and a dot, three trips through memory where one read of the
gradients will do. The loop accumulates in float64, block by block, each block's sum in the CPU's vector
lanes, so it agrees with the NumPy path to float64 rounding, not bit for bit. The lanes' order is the
compiler's choice for the CPU: every rank on one kind of CPU gets the same bits (each DDP rank computes
the norm of the same all-reduced gradients on its own), and ranks on CPUs with different vector widths
may differ in the last bit of the norm, as PyTorch's vectorised norms do.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from engine.fast.halfconv_jit import widen16

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


@njit(cache=True, nogil=True, fastmath={"reassoc"})
def _block_sum16(bits, bf16):  # pragma: no cover - compiled
    """_block_sum of 16-bit bits (bfloat16's when `bf16`, else float16's), each widened exactly."""
    total = 0.0
    for i in range(bits.size):
        wide = np.float64(widen16(bits[i], bf16))
        total += wide * wide
    return total


@njit(cache=True, nogil=True)
def sum_of_squares16(bits, bf16):  # pragma: no cover - compiled
    """sum_of_squares of a 16-bit array read as its bits: no widened copy of the gradients in between."""
    total = 0.0
    for start in range(0, bits.size, SUM_BLOCK):
        total += _block_sum16(bits[start:start + SUM_BLOCK], bf16)
    return total


@njit(cache=True, nogil=True, error_model="numpy")
def adamw(p, g, m, v, decay_mask, masked, consts):  # pragma: no cover - compiled
    """One AdamW step over flat arrays, in place, consts = (decay, b1_rest, b2, b2_rest, bias2, eps, step,
    unscale, clip) in p's dtype: with the gradient read as g unscale clip, p *= decay where decay_mask
    (everywhere when not `masked`; decay_mask is not read then), m += (g - m) b1_rest, v = v b2 + g b2_rest
    g (b_rest = 1 - b), p += (m step) / (sqrt(v) / bias2 + eps). A factor of 1 (no weight decay, no
    scaling) changes no bit, as skipping it would not."""
    decay, b1_rest, b2, b2_rest, bias2, eps, step, unscale, clip = consts
    for i in range(p.size):
        pi = p[i]
        if not masked or decay_mask[i]:
            pi = pi * decay
        gi = g[i] * unscale * clip
        mi = m[i] + (gi - m[i]) * b1_rest
        vi = v[i] * b2 + gi * b2_rest * gi
        m[i] = mi
        v[i] = vi
        p[i] = pi + mi * step / (np.sqrt(vi) / bias2 + eps)
