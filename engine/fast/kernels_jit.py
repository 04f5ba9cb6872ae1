"""GELU's and layer norm's arithmetic as compiled loops (numba): engine.fast.kernels' fast path.

Why compiled: a fused op written in NumPy is a chain of passes (GELU's backward is fifteen, layer norm's
backward ten with three reductions per row), each a call with its own overhead and a trip through the
cache; one compiled loop does the chain in registers. The loops compute in the arrays' own dtype
(float32, or float64 for the exact tests) with the constants in that dtype, so they do what the NumPy
chain does, operation for operation, in the same order.

GELU in float32 (and 16-bit, computed in float32) is one loop: its tanh is engine.fast.tanh32's rational
function (`tanh32` here), a few multiply-adds and a division in the CPU's widest vector registers, where a
libm tanh would be a call per element. The NumPy chain computes the same function with the same operations
in the same order, so GELU's results are the NumPy chain's bit for bit. In float64 tanh stays NumPy's,
between the loop before it (its argument) and the loop after (the output or the gradient).

Layer norm (float32 and float64, 16-bit through float32): each row's sums accumulate in the row's dtype
in the CPU's vector lanes (reassociation, only there: `_sum`, `_sum_sq`, `_grad_sums`), as PyTorch's do,
so they agree with the NumPy chain (whose sums go through BLAS) to rounding, not bit for bit. Rows are
never split, so every thread count gives the same bits; CPUs of different vector widths may differ in the
last bits of a row's statistics, as PyTorch's vectorised reductions do. Everything else is elementwise, in
the NumPy chain's order.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from engine.fast.halfconv_jit import narrow16, widen16

# Every constant comes in as an argument of the arrays' dtype (`one`, `half`, `eps`, ...): a Python literal
# in a numba expression would promote float32 arithmetic to float64. Loops that divide take NumPy's error
# model: Python's would test every divisor for zero and raise, which keeps the loop off the vector registers.


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


@njit(cache=True, nogil=True, error_model="numpy")
def tanh32(u, k):  # pragma: no cover - compiled
    """engine.fast.tanh32's rational tanh of one float32, k = tanh32.coefficients(): the same operations as
    tanh_numpy, in its order (a comparison that is false for NaN keeps NaN, as NumPy's maximum does)."""
    clamp, tiny, a1, a3, a5, a7, a9, a11, a13, b0, b2, b4, b6 = k
    w = clamp if u > clamp else (-clamp if u < -clamp else u)
    w2 = w * w
    p = ((((((w2 * a13 + a11) * w2 + a9) * w2 + a7) * w2 + a5) * w2 + a3) * w2 + a1) * w
    q = ((w2 * b6 + b4) * w2 + b2) * w2 + b0
    return u if abs(u) < tiny else p / q


@njit(cache=True, nogil=True, error_model="numpy")
def gelu32(x, c, ck, one, half, k, out):  # pragma: no cover - compiled
    """out = 0.5 x (1 + tanh32(c (x + k x^3))), float32, in one pass: gelu_arg, tanh32, gelu_out."""
    for i in range(x.size):
        v = x[i]
        out[i] = (tanh32((v * v * ck + c) * v, k) + one) * v * half


@njit(cache=True, nogil=True, error_model="numpy")
def gelu_grad32(x, g, c, ck, ck3, one, half, k, out):  # pragma: no cover - compiled
    """out = gelu_grad's expression with tanh32, float32, in one pass."""
    for i in range(x.size):
        v = x[i]
        t = tanh32((v * v * ck + c) * v, k)
        slope = v * v * ck3 + c
        out[i] = ((((one - t * t) * slope) * v + t) + one) * half * g[i]


# GELU on 16-bit arrays read and written as their bits (uint16; `bf16` picks bfloat16 over float16): the
# same float32 arithmetic as gelu32 / gelu_grad32 on exactly widened operands, rounded once, so the same
# bits as widening, computing and rounding in three passes, without the two conversion passes.

@njit(cache=True, nogil=True, error_model="numpy")
def gelu16(x, bf16, c, ck, one, half, k, out):  # pragma: no cover - compiled
    """out (16-bit) = gelu32 of the 16-bit x, rounded once."""
    for i in range(x.size):
        v = widen16(x[i], bf16)
        out[i] = narrow16((tanh32((v * v * ck + c) * v, k) + one) * v * half, bf16)


@njit(cache=True, nogil=True, error_model="numpy")
def gelu_grad16(x, g, bf16, c, ck, ck3, one, half, k, out):  # pragma: no cover - compiled
    """out (16-bit) = gelu_grad32's expression of the 16-bit x and g, rounded once."""
    for i in range(x.size):
        v = widen16(x[i], bf16)
        t = tanh32((v * v * ck + c) * v, k)
        slope = v * v * ck3 + c
        d = ((((one - t * t) * slope) * v + t) + one) * half
        out[i] = narrow16(d * widen16(g[i], bf16), bf16)


# ---- layer norm: one row at a time (a row is never split) -----------------------------------------
# Rows are addressed as (array, row index), never as views of one row (a view costs reference counting on
# the array, which the threads sharing it would contend for). The sums are separate functions, not inlined
# into the loops that call them: numba's own inlining would give them the caller's (strict) arithmetic,
# and the sums would run one element at a time. `zero` and `one` come in the arrays' dtype.

@njit(cache=True, nogil=True, fastmath={"reassoc"})
def _sum(x, i, m, zero):  # pragma: no cover - compiled
    """The sum of x[i] - m, in x's dtype (in vector lanes)."""
    total = zero
    for j in range(x.shape[1]):
        total += x[i, j] - m
    return total


@njit(cache=True, nogil=True, fastmath={"reassoc"})
def _sum_sq(x, i, m, zero):  # pragma: no cover - compiled
    """The sum of (x[i] - m)^2, in x's dtype (in vector lanes)."""
    total = zero
    for j in range(x.shape[1]):
        d = x[i, j] - m
        total += d * d
    return total


@njit(cache=True, nogil=True, fastmath={"reassoc"})
def _grad_sums(x, g, w, i, m, r, zero):  # pragma: no cover - compiled
    """(sum of g w, sum of g w xhat) over row i, xhat = (x - m) r, in x's dtype (in vector lanes)."""
    s1 = s2 = zero
    for j in range(x.shape[1]):
        a = g[i, j] * w[j]
        s1 += a
        s2 += a * ((x[i, j] - m) * r)
    return s1, s2


@njit(cache=True, nogil=True, error_model="numpy")
def layer_norm_rows(x, w, b, eps, one, has_bias, out, mu, rstd):  # pragma: no cover - compiled
    """Each row of x: mu = mean, rstd = 1 / sqrt(var + eps) (each stored, so rounded to its dtype, before
    use, as the NumPy chain rounds them), out = (x - mean) rstd w (+ b; b is not read without a bias).
    mu, rstd: [rows, 1]."""
    n, zero = x.shape[1], one - one
    for i in range(x.shape[0]):
        mu[i, 0] = _sum(x, i, zero, zero) / n
        m = mu[i, 0]
        rstd[i, 0] = _sum_sq(x, i, m, zero) / n
        rstd[i, 0] = one / np.sqrt(rstd[i, 0] + eps)
        r = rstd[i, 0]
        if has_bias:
            for j in range(n):
                out[i, j] = (x[i, j] - m) * r * w[j] + b[j]
        else:
            for j in range(n):
                out[i, j] = (x[i, j] - m) * r * w[j]


@njit(cache=True, nogil=True, error_model="numpy")
def layer_norm_rows_backward(x, g, w, mu, rstd, dx, dw, db, per):  # pragma: no cover - compiled
    """dx = rstd (g w - mean(g w) - xhat mean(g w xhat)) for each row (each mean rounded to dx's dtype
    first, as the NumPy chain's); row i adds g xhat and g into row i // per of dw and db ([blocks, n]: one
    sum per block of `per` rows, the same blocks however the rows are shared out)."""
    n, zero = x.shape[1], dx.dtype.type(0)
    for i in range(x.shape[0]):
        m, r, k = mu[i, 0], rstd[i, 0], i // per
        s1, s2 = _grad_sums(x, g, w, i, m, r, zero)
        dx[i, 0] = s1 / n
        c1 = dx[i, 0]
        dx[i, 0] = s2 / n
        c2 = dx[i, 0]
        for j in range(n):
            xh = (x[i, j] - m) * r
            dw[k, j] += g[i, j] * xh
            db[k, j] += g[i, j]
            dx[i, j] = ((g[i, j] * w[j] - c1) - xh * c2) * r


@njit(cache=True, nogil=True)
def layer_norm_rows16(x, bf16, w, b, eps, one, has_bias, out, mu, rstd, xs, ys):  # pragma: no cover
    """layer_norm_rows on 16-bit x (bits), out rounded once into 16-bit bits: each row widened into the
    float32 scratch row xs ([1, n]), normalised into ys, rounded from there."""
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            xs[0, j] = widen16(x[i, j], bf16)
        layer_norm_rows(xs, w, b, eps, one, has_bias, ys, mu[i:i + 1], rstd[i:i + 1])
        for j in range(x.shape[1]):
            out[i, j] = narrow16(ys[0, j], bf16)


@njit(cache=True, nogil=True)
def layer_norm_rows_backward16(x, g, bf16, w, mu, rstd, dx, dw, db, per, xs, gs, dxs):  # pragma: no cover
    """layer_norm_rows_backward on 16-bit x and g (bits), dx rounded once into 16-bit bits, row by row
    through float32 scratch rows ([1, n]) as layer_norm_rows16."""
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            xs[0, j] = widen16(x[i, j], bf16)
            gs[0, j] = widen16(g[i, j], bf16)
        k = i // per
        layer_norm_rows_backward(xs, gs, w, mu[i:i + 1], rstd[i:i + 1], dxs, dw[k:k + 1], db[k:k + 1], 1)
        for j in range(x.shape[1]):
            dx[i, j] = narrow16(dxs[0, j], bf16)
