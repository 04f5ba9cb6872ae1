"""GELU's and layer norm's arithmetic as compiled loops (numba): engine.fast.kernels' fast path.

Why compiled: a fused op written in NumPy is a chain of passes (GELU's backward is fifteen, layer norm's
backward ten with three reductions per row), each a call with its own overhead and a trip through memory;
one compiled loop reads its inputs once and writes its output once, the chain in vector registers.

GELU (float32, and 16-bit through float32): x sigmoid(2u) with u = c (x + k x^3), the same function as
0.5 x (1 + tanh(u)) written without the tanh: 1 + tanh(u) = 2 / (1 + exp(-2u)). Its exp is a polynomial
the loop vectorises (`_exp`; NumPy's tanh and libm's exp are calls the compiler cannot), so GELU's
results agree with the NumPy chain (engine.reference's formula, NumPy's tanh) to float32 rounding, not bit
for bit; the sigmoid form is the more accurate of the two where x is very negative (1 + tanh(u) there
is a difference of nearly equal numbers). Every operation is a plain IEEE one in a fixed order (no
fused multiply-adds, no reassociation), so every CPU, thread count and vector width gives the same bits.

Layer norm (float32 and float64, 16-bit through float32): each row's sums accumulate in the row's dtype
in the CPU's vector lanes (reassociation, only there: `_sum`, `_sum_sq`, `_grad_sums`), as PyTorch's do,
so they agree with the NumPy chain (whose sums go through BLAS) to rounding, not bit for bit. Rows are
never split, so every thread count gives the same bits; CPUs of different vector widths may differ in the
last bits of a row's statistics, as PyTorch's vectorised reductions do. Everything else is elementwise, in
the NumPy chain's order.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from engine.fast.halfconv_jit import float_from_bits, narrow16, widen16

# Constants are typed: a Python float in a numba expression would promote float32 arithmetic to float64.
_F = np.float32
_ZERO, _ONE, _HALF = _F(0), _F(1), _F(0.5)
_C = _F(math.sqrt(2.0 / math.pi))          # GELU's c
_CK = _F(math.sqrt(2.0 / math.pi) * 0.044715)  # c k
_CK3 = _F(3 * math.sqrt(2.0 / math.pi) * 0.044715)  # 3 c k: the slope of the tanh argument is c + 3 c k x^2

# exp(v) = 2^n exp(r), n = round(v / ln 2), r = v - n ln 2 (ln 2 in two parts, the first exact in n ln 2),
# exp(r) by Cephes' expf polynomial on |r| <= ln 2 / 2 (within 1.5 units in the last place of float32).
_LOG2E, _LN2_HI, _LN2_LO = _F(1.4426950408889634), _F(0.693359375), _F(-2.12194440e-4)
_P = tuple(_F(p) for p in (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
                           1.6666665459e-1, 5.0000001201e-1))
_EXP_LIMIT = _F(87.0)  # |v| at most this: 2^n stays a normal float and so does 1 / (1 + exp(v))


@njit(cache=True, nogil=True, inline="always")
def _exp(v):  # pragma: no cover - compiled
    """exp(v) in float32, branch-free so the loop vectorises: exp(87) for v above 87, 0 below -87 (NaN
    stays NaN). GELU needs no more range: past it 1 / (1 + exp(v)) is 1, or below 1e-37, and a gradient
    term exp(v) times a large x must vanish, not stay at float32's smallest normal scale."""
    w = _EXP_LIMIT if v > _EXP_LIMIT else v
    w = -_EXP_LIMIT if w < -_EXP_LIMIT else w
    n = np.floor(w * _LOG2E + _HALF)
    r = w - n * _LN2_HI
    r = r - n * _LN2_LO
    p = ((((_P[0] * r + _P[1]) * r + _P[2]) * r + _P[3]) * r + _P[4]) * r + _P[5]
    y = p * r * r + r + _ONE
    k = np.int32(n) if n == n else np.int32(0)  # (a NaN's y is NaN already; its n must not reach the cast)
    y = y * float_from_bits(np.uint32((k + np.int32(127)) << np.int32(23)))
    return _ZERO if v < -_EXP_LIMIT else y


@njit(cache=True, nogil=True, inline="always")
def _gelu(x):  # pragma: no cover - compiled
    """x sigmoid(2u) = x / (1 + exp(-2u)), u = c (x + k x^3) computed as ((x x) ck + c) x."""
    u = (x * x * _CK + _C) * x
    return x * (_ONE / (_ONE + _exp(-(u + u))))


@njit(cache=True, nogil=True, inline="always")
def _gelu_grad(x, g):  # pragma: no cover - compiled
    """g d/dx [x s], s = sigmoid(2u): g s (1 + 2 x u' (1 - s)), u' = c + 3 c k x^2, 1 - s = e s with
    e = exp(-2u) (no difference of nearly equal numbers)."""
    u = (x * x * _CK + _C) * x
    e = _exp(-(u + u))
    s = _ONE / (_ONE + e)
    slope = x * x * _CK3 + _C
    return g * (s * (_ONE + (x + x) * (slope * (e * s))))


@njit(cache=True, nogil=True, error_model="numpy")
def gelu(x, out):  # pragma: no cover - compiled; tests call it through engine.fast.kernels
    """out = gelu(x), float32 (out may be x)."""
    for i in range(x.size):
        out[i] = _gelu(x[i])


@njit(cache=True, nogil=True, error_model="numpy")
def gelu_grad(x, g, out):  # pragma: no cover - compiled
    """out = g gelu'(x), float32 (out may be x or g)."""
    for i in range(x.size):
        out[i] = _gelu_grad(x[i], g[i])


# GELU on 16-bit arrays read and written as their bits (uint16; `bf16` picks bfloat16 over float16): the
# float32 loops above on exactly widened operands, rounded once, so the same bits as widening, computing
# and rounding in three passes, without the two conversion passes.

@njit(cache=True, nogil=True, error_model="numpy")
def gelu16(x, bf16, out):  # pragma: no cover - compiled
    for i in range(x.size):
        out[i] = narrow16(_gelu(widen16(x[i], bf16)), bf16)


@njit(cache=True, nogil=True, error_model="numpy")
def gelu_grad16(x, g, bf16, out):  # pragma: no cover - compiled
    for i in range(x.size):
        out[i] = narrow16(_gelu_grad(widen16(x[i], bf16), widen16(g[i], bf16)), bf16)


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
