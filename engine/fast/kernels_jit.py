"""GELU's and layer norm's arithmetic as compiled loops (numba): engine.fast.kernels' fast path.

Why compiled: a fused op written in NumPy is a chain of passes (GELU's backward is fifteen, layer norm's
backward ten with three reductions per row), each a call with its own overhead and a trip through the
cache; one compiled loop does the chain in registers. The loops compute in the arrays' own dtype
(float32, or float64 for the exact tests) with the constants in that dtype, so they do what the NumPy
chain does, operation for operation, in the same order; GELU's tanh stays NumPy's (a compiled tanh
would be a scalar libm call per element, slower than NumPy's vectorised one), so GELU's results are the
NumPy chain's bit for bit. Layer norm's row sums accumulate in float64 here (NumPy's went through BLAS
in float32): its results agree with the NumPy chain to float32 rounding, not bit for bit.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from engine.fast.halfconv_jit import narrow16, widen16

# Every constant comes in as an argument of the arrays' dtype (`one`, `half`, `eps`, ...): a Python literal
# in a numba expression would promote float32 arithmetic to float64.


@njit(cache=True, nogil=True)
def gelu_arg(x, c, ck, out):  # pragma: no cover - compiled; tests call it through engine.fast.kernels
    """out = c (x + k x^3), as ((x x) ck + c) x with ck = c k: the argument of GELU's tanh."""
    for i in range(x.size):
        out[i] = (x[i] * x[i] * ck + c) * x[i]


@njit(cache=True, nogil=True)
def gelu_out(x, t, one, half, out):  # pragma: no cover - compiled
    """out = 0.5 x (1 + t), as ((t + 1) x) 0.5, t = tanh(GELU's argument)."""
    for i in range(x.size):
        out[i] = (t[i] + one) * x[i] * half


@njit(cache=True, nogil=True)
def gelu_grad(x, t, g, c, ck3, one, half, out):  # pragma: no cover - compiled
    """out = g (0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 k x^2)), in the NumPy chain's order: the slope
    (x x) ck3 + c, then ((((1 - t t) slope) x + t) + 1) 0.5 g."""
    for i in range(x.size):
        slope = x[i] * x[i] * ck3 + c
        out[i] = ((((one - t[i] * t[i]) * slope) * x[i] + t[i]) + one) * half * g[i]


# GELU on 16-bit arrays read and written as their bits (uint16; `bf16` picks bfloat16 over float16): the
# same float32 arithmetic as gelu_arg / gelu_out / gelu_grad on exactly widened operands, rounded once, so
# the same bits as widening, computing and rounding in three passes, without the two conversion passes.

@njit(cache=True, nogil=True)
def gelu_arg16(x, bf16, c, ck, out):  # pragma: no cover - compiled
    """out (float32) = GELU's tanh argument of the 16-bit x, as gelu_arg."""
    for i in range(x.size):
        v = widen16(x[i], bf16)
        out[i] = (v * v * ck + c) * v


@njit(cache=True, nogil=True)
def gelu_out16(x, bf16, t, one, half, out):  # pragma: no cover - compiled
    """out (16-bit) = 0.5 x (1 + t) rounded once, as gelu_out then one rounding."""
    for i in range(x.size):
        out[i] = narrow16((t[i] + one) * widen16(x[i], bf16) * half, bf16)


@njit(cache=True, nogil=True)
def gelu_grad16(x, g, bf16, t, c, ck3, one, half, out):  # pragma: no cover - compiled
    """out (16-bit) = gelu_grad's expression of the 16-bit x and g, rounded once."""
    for i in range(x.size):
        v = widen16(x[i], bf16)
        slope = v * v * ck3 + c
        d = ((((one - t[i] * t[i]) * slope) * v + t[i]) + one) * half
        out[i] = narrow16(d * widen16(g[i], bf16), bf16)


@njit(cache=True, nogil=True, inline="always")
def _row_sums(x, i, m, r, g, w):  # pragma: no cover - compiled
    """(sum of a, sum of a b) over row i, a = g w and b = (x - m) r when g is given, else a = x - m
    and b = a (so: the centred sum and the sum of squares). Four float64 accumulators each, so that
    the additions do not wait on one another; the same order on every call."""
    n = x.shape[1]
    s0 = s1 = s2 = s3 = 0.0
    q0 = q1 = q2 = q3 = 0.0
    j = 0
    while j + 4 <= n:
        a0, a1, a2, a3 = x[i, j] - m, x[i, j + 1] - m, x[i, j + 2] - m, x[i, j + 3] - m
        if g is None:
            b0, b1, b2, b3 = a0, a1, a2, a3
        else:
            b0, b1, b2, b3 = a0 * r, a1 * r, a2 * r, a3 * r
            a0, a1 = g[i, j] * w[j], g[i, j + 1] * w[j + 1]
            a2, a3 = g[i, j + 2] * w[j + 2], g[i, j + 3] * w[j + 3]
        s0 += a0
        s1 += a1
        s2 += a2
        s3 += a3
        q0 += a0 * b0
        q1 += a1 * b1
        q2 += a2 * b2
        q3 += a3 * b3
        j += 4
    while j < n:
        a0 = x[i, j] - m
        b0 = a0
        if g is not None:
            b0 = a0 * r
            a0 = g[i, j] * w[j]
        s0 += a0
        q0 += a0 * b0
        j += 1
    return (s0 + s1) + (s2 + s3), (q0 + q1) + (q2 + q3)


@njit(cache=True, nogil=True)
def layer_norm_rows(x, w, b, eps, one, has_bias, out, mu, rstd):  # pragma: no cover - compiled
    """Each row of x: mean, 1/std (sums in float64, stored in mu's dtype), then (x - mean) rstd w (+ b)."""
    rows, n = x.shape
    zero = one - one
    for i in range(rows):
        s, _ = _row_sums(x, i, zero, one, None, w)
        mu[i, 0] = s / n
        m = mu[i, 0]
        _, q = _row_sums(x, i, m, one, None, w)
        rstd[i, 0] = q / n
        rstd[i, 0] = one / np.sqrt(rstd[i, 0] + eps)
        r = rstd[i, 0]
        for j in range(n):
            y = (x[i, j] - m) * r * w[j]
            out[i, j] = y + b[j] if has_bias else y


@njit(cache=True, nogil=True)
def layer_norm_rows_backward(x, g, w, mu, rstd, dx, dw, db):  # pragma: no cover - compiled
    """dx = rstd (g w - mean(g w) - xhat mean(g w xhat)) per row (sums in float64); dw += g xhat and
    db += g over the rows, in dw's and db's dtype."""
    rows, n = x.shape
    for i in range(rows):
        m, r = mu[i, 0], rstd[i, 0]
        s1, s2 = _row_sums(x, i, m, r, g, w)
        dx[i, 0] = s1 / n  # mean(g w), stored in dx's dtype first, as the NumPy chain rounds it
        c1 = dx[i, 0]
        dx[i, 0] = s2 / n
        c2 = dx[i, 0]
        for j in range(n):
            xh = (x[i, j] - m) * r
            dw[j] += g[i, j] * xh
            db[j] += g[i, j]
            dx[i, j] = ((g[i, j] * w[j] - c1) - xh * c2) * r


@njit(cache=True, nogil=True)
def layer_norm_rows16(x, bf16, w, b, eps, one, has_bias, out, mu, rstd, xs, ys):  # pragma: no cover
    """layer_norm_rows on 16-bit x (bits), out rounded once into 16-bit bits: each row widened into the
    float32 scratch row xs, normalised into ys, rounded from there (all in one call, the rows in cache)."""
    rows, n = x.shape
    for i in range(rows):
        for j in range(n):
            xs[0, j] = widen16(x[i, j], bf16)
        layer_norm_rows(xs, w, b, eps, one, has_bias, ys, mu[i:i + 1], rstd[i:i + 1])
        for j in range(n):
            out[i, j] = narrow16(ys[0, j], bf16)


@njit(cache=True, nogil=True)
def layer_norm_rows_backward16(x, g, bf16, w, mu, rstd, dx, dw, db, xs, gs, dxs):  # pragma: no cover
    """layer_norm_rows_backward on 16-bit x and g (bits), dx rounded once into 16-bit bits, row by row
    through float32 scratch rows as layer_norm_rows16."""
    rows, n = x.shape
    for i in range(rows):
        for j in range(n):
            xs[0, j] = widen16(x[i, j], bf16)
            gs[0, j] = widen16(g[i, j], bf16)
        layer_norm_rows_backward(xs, gs, w, mu[i:i + 1], rstd[i:i + 1], dxs, dw, db)
        for j in range(n):
            dx[i, j] = narrow16(dxs[0, j], bf16)


