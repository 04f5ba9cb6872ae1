"""Fused elementwise kernels (GELU, layer norm), run block by block and shared among the rank's
threads (engine.blocks).

A fused op written in NumPy is a chain of whole-array passes (GELU's backward is fifteen). Run on
blocks, the chain's temporaries stay in cache; run by the rank's threads, its cores share the work.
Every element still sees the same operations in the same order, so results are unchanged; 16-bit
inputs are widened and outputs rounded block by block, inside the kernel. Model code: nothing here
knows about ranks.
"""

from __future__ import annotations

import math

import numpy as np

from engine import blocks, lowp
from engine.blocks import BLOCK

_GELU_C = math.sqrt(2.0 / math.pi)
_GELU_K = 0.044715

# ---- GELU (GPT-2's tanh approximation) -------------------------------------------------------------

def _tanh_arg(x: np.ndarray) -> np.ndarray:
    """tanh(c (x + k x^3)), in one new buffer."""
    t = x * x
    t *= _GELU_C * _GELU_K
    t += _GELU_C
    t *= x
    return np.tanh(t, out=t)


def gelu(x: np.ndarray) -> np.ndarray:
    """0.5 x (1 + tanh(c (x + k x^3))) in x's dtype, computed in float32 (float64 for float64)."""
    src = np.ascontiguousarray(x).reshape(-1)
    out = np.empty(src.shape, x.dtype)

    def block(lo: int, hi: int) -> None:
        x32 = lowp.widen(src[lo:hi])
        y = _tanh_arg(x32)
        y += 1
        y *= x32
        y *= 0.5
        out[lo:hi] = lowp.narrow(y, x.dtype)
    blocks.run(block, src.size)
    return out.reshape(x.shape)


def gelu_backward(x: np.ndarray, g: np.ndarray) -> np.ndarray:
    """g · d gelu(x)/dx in x's dtype: 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 k x^2), t = tanh(...)."""
    src, grad = np.ascontiguousarray(x).reshape(-1), np.ascontiguousarray(g).reshape(-1)
    out = np.empty(src.shape, x.dtype)

    def block(lo: int, hi: int) -> None:
        x32 = lowp.widen(src[lo:hi])
        t = _tanh_arg(x32)
        slope = x32 * x32  # d/dx of the tanh argument: c (1 + 3 k x^2)
        slope *= 3 * _GELU_C * _GELU_K
        slope += _GELU_C
        d = t * t
        np.subtract(1, d, out=d)
        d *= slope
        d *= x32
        d += t
        d += 1
        d *= 0.5
        d *= lowp.widen(grad[lo:hi])
        out[lo:hi] = lowp.narrow(d, x.dtype)
    blocks.run(block, src.size)
    return out.reshape(x.shape)


# ---- layer norm (rows of the last axis) ------------------------------------------------------------

def _row_sum(a: np.ndarray) -> np.ndarray:
    """Sums over the rows of a 2-D float array, kept as a column: a matrix-vector product (on rows of
    ~100 elements BLAS is ~5x faster than NumPy's reduction)."""
    return a @ np.ones((a.shape[1], 1), a.dtype)


def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, eps: float):
    """(y in x's dtype, mean, 1/std) of normalising the rows of 2-D `x`, then scaling by w, shifting by
    b; the statistics in the compute dtype, one per row."""
    rows, n = x.shape
    cdt = lowp.widen(x[:1]).dtype
    w32, b32 = w.astype(cdt, copy=False), None if b is None else b.astype(cdt, copy=False)
    out, mu, rstd = np.empty(x.shape, x.dtype), np.empty((rows, 1), cdt), np.empty((rows, 1), cdt)

    def block(lo: int, hi: int) -> None:
        x2 = lowp.widen(x[lo:hi])
        m = _row_sum(x2)
        m /= n
        xhat = x2 - m
        r = np.einsum("ij,ij->i", xhat, xhat)[:, None]  # row sums of squares, without a temporary
        r /= n
        r += eps
        np.sqrt(r, out=r)
        np.reciprocal(r, out=r)
        xhat *= r
        xhat *= w32
        if b32 is not None:
            xhat += b32
        out[lo:hi], mu[lo:hi], rstd[lo:hi] = lowp.narrow(xhat, x.dtype), m, r
    blocks.run(block, rows, max(1, BLOCK // n))
    return out, mu, rstd


def layer_norm_backward(x: np.ndarray, w: np.ndarray, mu: np.ndarray, rstd: np.ndarray, g: np.ndarray):
    """(dx in x's dtype, dw, db in the compute dtype) for layer_norm's rows: dx = rstd (dxhat -
    mean(dxhat) - xhat mean(dxhat xhat)), dxhat = g w."""
    rows, n = x.shape
    cdt = mu.dtype
    w32 = w.astype(cdt, copy=False)
    dx_out = np.empty(x.shape, x.dtype)
    n_blocks = math.ceil(rows / max(1, BLOCK // n))
    dw_parts, db_parts = np.zeros((n_blocks, n), cdt), np.zeros((n_blocks, n), cdt)
    step = max(1, BLOCK // n)

    def block(lo: int, hi: int) -> None:
        g2 = lowp.widen(g[lo:hi])
        xh = lowp.widen(x[lo:hi]) - mu[lo:hi]
        xh *= rstd[lo:hi]
        k = lo // step
        np.einsum("ij,ij->j", g2, xh, out=dw_parts[k])
        np.sum(g2, axis=0, out=db_parts[k])
        dx = g2 * w32
        xh *= np.einsum("ij,ij->i", dx, xh)[:, None] / n
        dx -= _row_sum(dx) / n
        dx -= xh
        dx *= rstd[lo:hi]
        dx_out[lo:hi] = lowp.narrow(dx, x.dtype)
    blocks.run(block, rows, step)
    return dx_out, dw_parts.sum(0), db_parts.sum(0)
