"""Fused elementwise kernels: GELU and layer norm, shared among the rank's threads
(engine.fast.thread_pool). Attention has its own: engine.fast.flash.

A fused op written in NumPy is a chain of whole-array passes (GELU's backward is fifteen). Where numba is
installed the chain is compiled (engine.fast.kernels_jit) and each of the rank's threads takes one
contiguous range of the work: layer norm's rows in one compiled call; GELU's elements in one compiled
pass in float32 (its tanh engine.fast.tanh32's rational function, kernels_jit says why), and in float64 a
block at a time, NumPy's tanh between two compiled loops, the block's temporary kept in cache.
Where numba is missing the named NumPy chain (`_gelu_numpy`, ...; engine.reference has the formulas) runs
block by block, so its temporaries stay in cache, the blocks shared among the threads. Each kernel picks
its way once (`_route`): the compiled loops (float32 and float64), the fused 16-bit loops (16-bit bits in
and out, float32 inside), 16-bit blocks widened around the float32 loops (where the fused loops cannot
read them), or the NumPy chain.

GELU's results are the NumPy chain's bit for bit, on every way; layer norm's agree with it to rounding
(kernels_jit says why). What never differs is the bits between one thread and several: every element (and
every row's sums, and the blocks of rows each weight gradient is summed over) is computed alike however
the work is shared. 16-bit inputs are widened and outputs rounded inside the kernel, once.
Model code: nothing here knows about ranks.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from engine.dtypes import LOW_PRECISION
from engine.fast import lowp, thread_pool
from engine.fast.compiled import load
from engine.fast.tanh32 import coefficients, tanh_numpy
from engine.fast.thread_pool import BLOCK

_GELU_C = math.sqrt(2.0 / math.pi)
_GELU_K = 0.044715
# Elements per thread at least before a compiled kernel is shared among the rank's threads: below,
# the hand-off to a second thread (a wake-up inside a step, where the other core may be busy) costs more
# than half the loop's time saves.
SHARE_GRAIN = 1 << 18
_U16 = np.uint16


# ---- which loop ------------------------------------------------------------------------------------

def _route(arrays: tuple, compiled: tuple) -> tuple[str, Any, bool]:
    """(way, kernels_jit, bf16) for a kernel on C-contiguous `arrays`: "compiled" when they are all of one
    dtype in `compiled`; for one 16-bit dtype "fused16" (bf16: bfloat16 rather than float16) where the fused
    loops read it, else "widened"; "numpy" where numba is missing, for mixed dtypes and for the rest."""
    jit, dtype = load("kernels_jit"), arrays[0].dtype
    if jit is None or any(a.dtype != dtype for a in arrays):
        return "numpy", None, False
    if dtype in compiled:
        return "compiled", jit, False
    if dtype not in LOW_PRECISION:
        return "numpy", None, False
    if not lowp.compiled_reads(dtype):
        return "widened", jit, False  # the fused loops convert halves with the CPU's own instructions
    return "fused16", jit, dtype != np.float16


def _shared(fn: Callable[[int, int], None], n: int, grain: int) -> None:
    """fn(lo, hi), one call per thread over [0, n), `grain` items a thread at least."""
    thread_pool.split(fn, n, max(1, grain))


# ---- GELU (GPT-2's tanh approximation) -------------------------------------------------------------

_GELU_COMPILED = (np.dtype(np.float32), np.dtype(np.float64))
TANH32 = coefficients()  # the float32 loops' tanh (engine.fast.tanh32)


def _constants(dtype: np.dtype) -> tuple:
    """(c, c k, 3 c k, 1, 0.5) in the compute dtype, as NumPy casts the Python floats of the chain."""
    t = dtype.type
    return t(_GELU_C), t(_GELU_C * _GELU_K), t(3 * _GELU_C * _GELU_K), t(1), t(0.5)


def gelu(x: np.ndarray) -> np.ndarray:
    """0.5 x (1 + tanh(c (x + k x^3))) in x's dtype, computed in float32 (float64 for float64)."""
    src = np.ascontiguousarray(x).reshape(-1)
    out = np.empty(src.shape, x.dtype)
    way, jit, bf16 = _route((src,), _GELU_COMPILED)
    if way == "numpy":
        thread_pool.run(lambda lo, hi: _gelu_numpy(src[lo:hi], out[lo:hi]), src.size)
    else:
        _shared(lambda lo, hi: _gelu_compiled(jit, way, bf16, src[lo:hi], out[lo:hi]), src.size,
                SHARE_GRAIN)
    return out.reshape(x.shape)


def _gelu_compiled(jit, way: str, bf16: bool, x: np.ndarray, out: np.ndarray) -> None:
    """gelu's share of one thread: float32 and 16-bit bits in one compiled pass (tanh32's tanh); float64
    and widened 16-bit a block at a time (_float64_blocks, _widened_blocks)."""
    c, ck, _, one, half = _constants(lowp.widen(x[:1]).dtype)
    if way == "fused16":
        jit.gelu16(x.view(_U16), bf16, c, ck, one, half, TANH32, out.view(_U16))
    elif x.dtype == np.float32:
        jit.gelu32(x, c, ck, one, half, TANH32, out)
    elif way == "widened":
        _widened_blocks(x, out, lambda xb, dst, lo, hi: jit.gelu32(xb, c, ck, one, half, TANH32, dst))
    else:
        _float64_blocks(jit, x, lambda lo, hi, xb, tt: jit.gelu_out(xb, tt, one, half, out[lo:hi]))


def gelu_backward(x: np.ndarray, g: np.ndarray) -> np.ndarray:
    """g · d gelu(x)/dx in x's dtype: 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 k x^2), t = tanh(...)."""
    src, grad = np.ascontiguousarray(x).reshape(-1), np.ascontiguousarray(g).reshape(-1)
    out = np.empty(src.shape, x.dtype)
    way, jit, bf16 = _route((src, grad), _GELU_COMPILED)
    if way == "numpy":
        thread_pool.run(lambda lo, hi: _gelu_grad_numpy(src[lo:hi], grad[lo:hi], out[lo:hi]), src.size)
    else:
        _shared(lambda lo, hi: _gelu_grad_compiled(jit, way, bf16, src[lo:hi], grad[lo:hi], out[lo:hi]),
                src.size, SHARE_GRAIN)
    return out.reshape(x.shape)


def _gelu_grad_compiled(jit, way: str, bf16: bool, x: np.ndarray, g: np.ndarray, out: np.ndarray) -> None:
    """gelu_backward's share of one thread, by the ways of _gelu_compiled."""
    c, ck, ck3, one, half = _constants(lowp.widen(x[:1]).dtype)
    if way == "fused16":
        bits = (x.view(_U16), g.view(_U16))
        jit.gelu_grad16(*bits, bf16, c, ck, ck3, one, half, TANH32, out.view(_U16))
    elif x.dtype == np.float32:
        jit.gelu_grad32(x, g, c, ck, ck3, one, half, TANH32, out)
    elif way == "widened":
        _widened_blocks(x, out, lambda xb, dst, lo, hi: jit.gelu_grad32(
            xb, lowp.widen(g[lo:hi]), c, ck, ck3, one, half, TANH32, dst))
    else:
        _float64_blocks(jit, x, lambda lo, hi, xb, tt: jit.gelu_grad(xb, tt, g[lo:hi], c, ck3, one, half,
                                                                      out[lo:hi]))


def _widened_blocks(x: np.ndarray, out: np.ndarray, compute: Callable[..., None]) -> None:
    """16-bit x the fused loops cannot read: each block widened to float32, computed by
    compute(xb, dst, lo, hi) into dst and rounded once into out."""
    t = np.empty(min(BLOCK, x.size), np.float32)
    for lo in range(0, x.size, BLOCK):
        hi = min(x.size, lo + BLOCK)
        compute(lowp.widen(x[lo:hi]), t[:hi - lo], lo, hi)
        lowp.narrow_into(t[:hi - lo], out[lo:hi])


def _float64_blocks(jit, x: np.ndarray, last: Callable[..., None]) -> None:
    """float64 GELU or its gradient, BLOCK elements at a time (the block's tanh argument stays in cache):
    the argument (compiled loop), NumPy's tanh in place, then last(lo, hi, xb, tt), the compiled loop that
    writes the block given its tanh tt."""
    c, ck = _constants(x.dtype)[:2]
    t = np.empty(min(BLOCK, x.size), x.dtype)
    for lo in range(0, x.size, BLOCK):
        hi = min(x.size, lo + BLOCK)
        tt = t[:hi - lo]
        jit.gelu_arg(x[lo:hi], c, ck, tt)
        np.tanh(tt, out=tt)
        last(lo, hi, x[lo:hi], tt)


def _tanh_arg(x: np.ndarray) -> np.ndarray:
    """tanh(c (x + k x^3)), in one new buffer: tanh32's in float32, NumPy's in float64."""
    t = x * x
    t *= _GELU_C * _GELU_K
    t += _GELU_C
    t *= x
    return tanh_numpy(t) if t.dtype == np.float32 else np.tanh(t, out=t)


def _gelu_numpy(x: np.ndarray, out: np.ndarray) -> None:
    """The whole-array chain on one block, its passes written in place (engine.reference.gelu is the
    formula)."""
    x32 = lowp.widen(x)
    y = _tanh_arg(x32)
    y += 1
    y *= x32
    y *= 0.5
    lowp.narrow_into(y, out)


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

_LN_COMPILED = (np.dtype(np.float32), np.dtype(np.float64))


def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, eps: float):
    """(y in x's dtype, mean, 1/std) of normalising the rows of 2-D `x`, then scaling by w, shifting by
    b; the statistics in the compute dtype, one per row."""
    x = np.ascontiguousarray(x)
    rows, n = x.shape
    cdt = lowp.widen(x[:1]).dtype
    w32, b32 = w.astype(cdt, copy=False), None if b is None else b.astype(cdt, copy=False)
    out, mu, rstd = np.empty(x.shape, x.dtype), np.empty((rows, 1), cdt), np.empty((rows, 1), cdt)
    way, jit, bf16 = _route((x,), _LN_COMPILED)
    shift = w32 if b32 is None else b32  # not read without a bias
    consts = (cdt.type(eps), cdt.type(1), b32 is not None)
    if way == "compiled":
        _shared(lambda lo, hi: jit.layer_norm_rows(x[lo:hi], w32, shift, *consts, out[lo:hi], mu[lo:hi],
                                                   rstd[lo:hi]), rows, SHARE_GRAIN // n)
    elif way == "fused16":
        def fused(lo: int, hi: int) -> None:  # float32 scratch rows of its own for each share
            jit.layer_norm_rows16(x[lo:hi].view(_U16), bf16, w32, shift, *consts, out[lo:hi].view(_U16),
                                  mu[lo:hi], rstd[lo:hi], np.empty((1, n), cdt), np.empty((1, n), cdt))
        _shared(fused, rows, SHARE_GRAIN // n)
    elif way == "widened":
        def widened(lo: int, hi: int) -> None:
            y = np.empty((hi - lo, n), cdt)
            jit.layer_norm_rows(lowp.widen(x[lo:hi]), w32, shift, *consts, y, mu[lo:hi], rstd[lo:hi])
            lowp.narrow_into(y, out[lo:hi])
        thread_pool.run(widened, rows, max(1, BLOCK // n))
    else:
        thread_pool.run(lambda lo, hi: _layer_norm_numpy(x[lo:hi], w32, b32, eps, out[lo:hi], mu[lo:hi],
                                                         rstd[lo:hi]), rows, max(1, BLOCK // n))
    return out, mu, rstd


def _row_sum(a: np.ndarray) -> np.ndarray:
    """Sums over the rows of a 2-D float array, kept as a column: a matrix-vector product (on rows of
    ~100 elements BLAS is ~5x faster than NumPy's reduction)."""
    return a @ np.ones((a.shape[1], 1), a.dtype)


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
    mean(dxhat) - xhat mean(dxhat xhat)), dxhat = g w. dw and db are summed per block of rows (`per`
    rows), then over the blocks in order: the same sums however the rows are shared among threads."""
    x, g = np.ascontiguousarray(x), np.ascontiguousarray(g)
    rows, n = x.shape
    cdt = mu.dtype
    w32 = w.astype(cdt, copy=False)
    dx_out = np.empty(x.shape, x.dtype)
    per = max(1, BLOCK // n)
    blocks = math.ceil(rows / per)
    dw_parts, db_parts = np.zeros((blocks, n), cdt), np.zeros((blocks, n), cdt)
    way, jit, bf16 = _route((x, g), _LN_COMPILED)
    if way in ("compiled", "fused16"):
        def share(first: int, last: int) -> None:  # blocks [first, last) in one compiled call
            lo, hi = first * per, min(rows, last * per)
            stats, parts = (mu[lo:hi], rstd[lo:hi]), (dw_parts[first:last], db_parts[first:last], per)
            if way == "compiled":
                jit.layer_norm_rows_backward(x[lo:hi], g[lo:hi], w32, *stats, dx_out[lo:hi], *parts)
            else:  # with float32 scratch rows of its own for x, g and dx
                jit.layer_norm_rows_backward16(x[lo:hi].view(_U16), g[lo:hi].view(_U16), bf16, w32, *stats,
                                               dx_out[lo:hi].view(_U16), *parts,
                                               *(np.empty((1, n), cdt) for _ in "xgd"))
        _shared(share, blocks, SHARE_GRAIN // (per * n))
        return dx_out, dw_parts.sum(0), db_parts.sum(0)
    block = _layer_norm_grad_numpy if way == "numpy" else functools.partial(_layer_norm_grad_widened, jit)

    def rows_block(lo: int, hi: int) -> None:  # each block of rows adds its dw, db into its own part
        block(x[lo:hi], g[lo:hi], w32, mu[lo:hi], rstd[lo:hi], dx_out[lo:hi], dw_parts[lo // per],
              db_parts[lo // per])
    thread_pool.run(rows_block, rows, per)
    return dx_out, dw_parts.sum(0), db_parts.sum(0)


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


def _layer_norm_grad_widened(jit: ModuleType, x, g, w32, mu, rstd, dx_out, dw, db) -> None:
    """A block of 16-bit rows widened around the compiled float32 loop (its rows are one part)."""
    dx = np.empty(dx_out.shape, mu.dtype)
    jit.layer_norm_rows_backward(lowp.widen(x), lowp.widen(g), w32, mu, rstd, dx, dw[None], db[None], len(x))
    lowp.narrow_into(dx, dx_out)


def warm_up() -> None:
    """Load the compiled loops (numba and the cached machine code of every loop a float32, float16 or
    bfloat16 step calls) now rather than inside the first step: a measurement of the step's memory
    (tracemalloc) or time should not see the loading of code. Does nothing where numba is missing."""
    if load("kernels_jit") is None:
        return
    x = np.linspace(-3, 3, 2 * BLOCK, dtype=np.float32).reshape(-1, 64)
    w = np.ones(64, np.float32)
    for dtype in (np.float32, *LOW_PRECISION):
        xd = lowp.narrow(x, dtype)
        lowp.widen(xd)
        gelu_backward(gelu(xd), xd)
        for bias in (w, None):
            _, mu, rstd = layer_norm(xd, w, bias, 1e-5)
            layer_norm_backward(xd, w, mu, rstd, xd)
