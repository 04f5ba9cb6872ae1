"""Fused elementwise kernels: GELU and layer norm, run block by block and shared among the rank's
threads (engine.fast.thread_pool). Attention has its own: engine.fast.flash.

A fused op written in NumPy is a chain of whole-array passes (GELU's backward is fifteen). Run on
blocks, the chain's temporaries stay in cache; run by the rank's threads, its cores share the work;
where numba is installed, each chain is one compiled loop (engine.fast.kernels_jit). Each kernel picks
its block function once (`_path`): the fused 16-bit loop or the compiled loop where numba is installed,
else the named NumPy chain (`_gelu_numpy`, ...; engine.reference has the formulas). Every element still
sees the same operations in the same order (layer norm's row sums aside: float64 in the compiled loop),
so results are unchanged; 16-bit inputs are widened and outputs rounded block by block, inside the kernel.
Model code: nothing here knows about ranks.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np

from engine.dtypes import LOW_PRECISION
from engine.fast import lowp, thread_pool
from engine.fast.compiled import load
from engine.fast.thread_pool import BLOCK

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


def _constants(dtype: np.dtype) -> tuple:
    """(c, c k, 3 c k, 1, 0.5) in the compute dtype, as NumPy casts the Python floats of the chain."""
    t = dtype.type
    return t(_GELU_C), t(_GELU_C * _GELU_K), t(3 * _GELU_C * _GELU_K), t(1), t(0.5)


def _jit_tanh_arg(jit, x: np.ndarray, consts: tuple) -> np.ndarray:
    t = np.empty_like(x)
    jit.gelu_arg(x, consts[0], consts[1], t)
    return np.tanh(t, out=t)


def _fused16(jit, *arrays: np.ndarray) -> bool | None:
    """Whether the fused 16-bit loops apply to `arrays` (one 16-bit dtype), and which: True for bfloat16,
    False for float16 (where the CPU converts halves itself); None to widen and round around the float32
    loops instead."""
    dtype = arrays[0].dtype
    if jit is None or dtype not in LOW_PRECISION or any(a.dtype != dtype for a in arrays):
        return None
    conversions = load("halfconv_jit")
    if dtype == np.float16 and not (conversions is not None and conversions.HAS_F16C):
        return None
    return dtype != np.float16


def _path(arrays: tuple, fused16: Callable, compiled: Callable, numpy: Callable) -> Callable:
    """A kernel's block function: `fused16(jit, bf16, ...)` on 16-bit `arrays` (C-contiguous, one dtype)
    where numba is installed, else `compiled(jit, ...)`; without numba, the NumPy chain `numpy(...)`."""
    jit = load("kernels_jit")
    if jit is None:
        return numpy
    bf16 = _fused16(jit, *arrays) if all(a.flags.c_contiguous for a in arrays) else None
    return functools.partial(compiled, jit) if bf16 is None else functools.partial(fused16, jit, bf16)


_F32 = _constants(np.dtype(np.float32))


def _jit_tanh_arg16(jit, bits: np.ndarray, bf16: bool) -> np.ndarray:
    """_jit_tanh_arg of 16-bit `bits` (float32 out), their widening inside the compiled loop."""
    t = np.empty(bits.size, np.float32)
    jit.gelu_arg16(bits, bf16, _F32[0], _F32[1], t)
    return np.tanh(t, out=t)


def gelu(x: np.ndarray) -> np.ndarray:
    """0.5 x (1 + tanh(c (x + k x^3))) in x's dtype, computed in float32 (float64 for float64)."""
    src = np.ascontiguousarray(x).reshape(-1)
    out = np.empty(src.shape, x.dtype)
    block = _path((src,), _gelu_fused16, _gelu_compiled, _gelu_numpy)
    thread_pool.run(lambda lo, hi: block(src[lo:hi], out[lo:hi]), src.size)
    return out.reshape(x.shape)


def _gelu_fused16(jit, bf16: bool, x: np.ndarray, out: np.ndarray) -> None:
    """16 bits in and out, float32 inside: no conversion passes."""
    bits, (_, _, _, one, half) = x.view(np.uint16), _F32
    t = _jit_tanh_arg16(jit, bits, bf16)
    jit.gelu_out16(bits, bf16, t, one, half, out.view(np.uint16))


def _gelu_compiled(jit, x: np.ndarray, out: np.ndarray) -> None:
    x32 = lowp.widen(x)
    consts = _constants(x32.dtype)
    t = _jit_tanh_arg(jit, x32, consts)
    if out.dtype == t.dtype:
        jit.gelu_out(x32, t, consts[3], consts[4], out)
    else:
        jit.gelu_out(x32, t, consts[3], consts[4], t)
        lowp.narrow_into(t, out)


def _gelu_numpy(x: np.ndarray, out: np.ndarray) -> None:
    """The whole-array chain on one block, its passes written in place (engine.reference.gelu is the
    formula)."""
    x32 = lowp.widen(x)
    y = _tanh_arg(x32)
    y += 1
    y *= x32
    y *= 0.5
    lowp.narrow_into(y, out)


def gelu_backward(x: np.ndarray, g: np.ndarray) -> np.ndarray:
    """g · d gelu(x)/dx in x's dtype: 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 k x^2), t = tanh(...)."""
    src, grad = np.ascontiguousarray(x).reshape(-1), np.ascontiguousarray(g).reshape(-1)
    out = np.empty(src.shape, x.dtype)
    block = _path((src, grad), _gelu_grad_fused16, _gelu_grad_compiled, _gelu_grad_numpy)
    thread_pool.run(lambda lo, hi: block(src[lo:hi], grad[lo:hi], out[lo:hi]), src.size)
    return out.reshape(x.shape)


def _gelu_grad_fused16(jit, bf16: bool, x: np.ndarray, g: np.ndarray, out: np.ndarray) -> None:
    """16 bits in and out, float32 inside: no conversion passes."""
    bits, (c, _, ck3, one, half) = x.view(np.uint16), _F32
    t = _jit_tanh_arg16(jit, bits, bf16)
    jit.gelu_grad16(bits, g.view(np.uint16), bf16, t, c, ck3, one, half, out.view(np.uint16))


def _gelu_grad_compiled(jit, x: np.ndarray, g: np.ndarray, out: np.ndarray) -> None:
    x32 = lowp.widen(x)
    c, _, ck3, one, half = consts = _constants(x32.dtype)
    t = _jit_tanh_arg(jit, x32, consts)
    g32 = np.asarray(lowp.widen(g), x32.dtype)
    dst = out if out.dtype == t.dtype else t
    jit.gelu_grad(x32, t, g32, c, ck3, one, half, dst)
    if dst is t:
        lowp.narrow_into(t, out)


def _gelu_grad_numpy(x: np.ndarray, g: np.ndarray, out: np.ndarray) -> None:
    """The whole-array chain on one block (engine.reference.gelu_backward is the formula)."""
    x32 = lowp.widen(x)
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
    d *= lowp.widen(g)
    lowp.narrow_into(d, out)


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
    block = _path((x,), _layer_norm_fused16, _layer_norm_compiled, _layer_norm_numpy)
    thread_pool.run(lambda lo, hi: block(x[lo:hi], w32, b32, eps, out[lo:hi], mu[lo:hi], rstd[lo:hi]),
                    rows, max(1, BLOCK // n))
    return out, mu, rstd


def _layer_norm_fused16(jit, bf16: bool, x, w32, b32, eps: float, out, mu, rstd) -> None:
    """16 bits in and out, float32 inside: no conversion passes."""
    cdt, n = mu.dtype, x.shape[1]
    shift = w32 if b32 is None else b32  # not read without a bias
    jit.layer_norm_rows16(x.view(np.uint16), bf16, w32, shift, cdt.type(eps), cdt.type(1), b32 is not None,
                          out.view(np.uint16), mu, rstd, np.empty((1, n), cdt), np.empty((1, n), cdt))


def _layer_norm_compiled(jit, x, w32, b32, eps: float, out, mu, rstd) -> None:
    cdt, x2 = mu.dtype, lowp.widen(x)
    y = out if out.dtype == cdt else np.empty(x2.shape, cdt)
    shift = w32 if b32 is None else b32  # not read without a bias
    jit.layer_norm_rows(x2, w32, shift, cdt.type(eps), cdt.type(1), b32 is not None, y, mu, rstd)
    if out.dtype != cdt:
        lowp.narrow_into(y, out)


def _layer_norm_numpy(x, w32, b32, eps: float, out, mu, rstd) -> None:
    """The whole-array chain on a block of rows (engine.reference.layer_norm is the formula)."""
    x2, n = lowp.widen(x), x.shape[1]
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
    lowp.narrow_into(xhat, out)
    mu[...], rstd[...] = m, r


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
    block = _path((x, g), _layer_norm_grad_fused16, _layer_norm_grad_compiled, _layer_norm_grad_numpy)

    def rows_block(lo: int, hi: int) -> None:  # each block of rows adds its dw, db into its own part
        block(x[lo:hi], g[lo:hi], w32, mu[lo:hi], rstd[lo:hi], dx_out[lo:hi], dw_parts[lo // step],
              db_parts[lo // step])
    thread_pool.run(rows_block, rows, step)
    return dx_out, dw_parts.sum(0), db_parts.sum(0)


def _layer_norm_grad_fused16(jit, bf16: bool, x, g, w32, mu, rstd, dx, dw, db) -> None:
    """16 bits in and out, float32 inside: no conversion passes."""
    cdt, n = mu.dtype, x.shape[1]
    jit.layer_norm_rows_backward16(x.view(np.uint16), g.view(np.uint16), bf16, w32, mu, rstd,
                                   dx.view(np.uint16), dw, db, *(np.empty((1, n), cdt) for _ in "xgd"))


def _layer_norm_grad_compiled(jit, x, g, w32, mu, rstd, dx_out, dw, db) -> None:
    cdt, g2 = mu.dtype, lowp.widen(g)
    dx = dx_out if dx_out.dtype == cdt else np.empty(g2.shape, cdt)
    jit.layer_norm_rows_backward(lowp.widen(x), g2, w32, mu, rstd, dx, dw, db)
    if dx_out.dtype != cdt:
        lowp.narrow_into(dx, dx_out)


def _layer_norm_grad_numpy(x, g, w32, mu, rstd, dx_out, dw, db) -> None:
    """The whole-array chain on a block of rows (engine.reference.layer_norm_backward is the formula)."""
    g2, n = lowp.widen(g), x.shape[1]
    xh = lowp.widen(x) - mu
    xh *= rstd
    np.einsum("ij,ij->j", g2, xh, out=dw)
    np.sum(g2, axis=0, out=db)
    dx = g2 * w32
    xh *= np.einsum("ij,ij->i", dx, xh)[:, None] / n
    dx -= _row_sum(dx) / n
    dx -= xh
    dx *= rstd
    lowp.narrow_into(dx, dx_out)


def warm_up() -> None:
    """Load the compiled loops (numba and the cached machine code of every loop a float32, float16 or
    bfloat16 step calls) now rather than inside the first step: a measurement of the step's memory
    (tracemalloc) or time should not see the loading of code. Does nothing where numba is missing."""
    if load("kernels_jit") is None:
        return
    x = np.linspace(-3, 3, 2 * BLOCK, dtype=np.float32).reshape(-1, 64)
    w = np.ones(64, np.float32)
    gelu_backward(gelu(x), x)
    for bias in (w, None):
        _, mu, rstd = layer_norm(x, w, bias, 1e-5)
        layer_norm_backward(x, w, mu, rstd, x)
    for dtype in LOW_PRECISION:
        lowp.widen(lowp.narrow(x, dtype))
