"""16-bit arithmetic done in float32: widen exactly, compute, round once.

NumPy's own float16 arithmetic (and ml_dtypes' bfloat16) computes each element in float32 and rounds
it back, one element at a time, at ~5-10 ns per element; float32 arithmetic runs at memory speed.
Doing the same float32 arithmetic on exactly widened operands and rounding the result once gives the
same bits (float32 holds every 16-bit value exactly, and one rounding of the float32 result is what
NumPy does per element), so `add` here equals `a + b` bit for bit (NaN payloads aside), faster. Fused ops
go further, as matrix units and fused GPU kernels do: they keep a whole computation in float32 and
round only what they return.

float16 <-> float32 and bfloat16 <-> float32 go through engine.fast.halfconv (compiled loops where numba is
installed; NumPy's and ml_dtypes' own casts otherwise, with the same bits). float32 and float64 pass
through untouched.
"""

from __future__ import annotations

import numpy as np

from engine.dtypes import LOW_PRECISION
from engine.fast import halfconv, thread_pool
from engine.fast.compiled import load

# Elements from which a conversion is shared among the rank's threads, by: compiled conversions. The
# compiled ones (~0.1-0.3 ns per element while the arrays fit the cache) gained nothing from a second
# thread below ~4 Mi elements (2 cores, measured: 1 Mi elements took 0.27-0.29 ns per element either
# way, 16 Mi 0.5-0.77 alone and 0.44-0.5 shared); NumPy's (1-4 ns per element) repay it from two threads.
SHARED_CONVERT_FROM = {True: 128 * thread_pool.BLOCK, False: 2 * thread_pool.BLOCK}


def compiled_reads(dtype: np.dtype) -> bool:
    """Whether compiled loops can read and write this 16-bit dtype's bits themselves (halfconv_jit's
    widen16 and narrow16): bfloat16 always, float16 with the CPU's own conversions (F16C)."""
    if dtype not in LOW_PRECISION:
        return False
    conversions = load("halfconv_jit")
    return conversions is not None and (dtype != np.float16 or conversions.HAS_F16C)


def widen(a: np.ndarray) -> np.ndarray:
    """`a` in its compute dtype: 16-bit floats exactly as float32; anything else as it is (no copy)."""
    return _convert(a, np.dtype(np.float32)) if a.dtype in LOW_PRECISION else a


def narrow(x: np.ndarray, dtype) -> np.ndarray:
    """`x` rounded to `dtype` (to nearest, ties to even; overflow to inf without a warning); no copy
    when it already has it."""
    dtype = np.dtype(dtype)
    if x.dtype == dtype:
        return x
    if x.dtype == np.float32 and dtype in LOW_PRECISION:
        return _convert(x, dtype)  # halfconv's casts never warn on overflow (an errstate costs microseconds)
    with np.errstate(over="ignore"):
        return _convert(x, dtype)


def narrow_into(x: np.ndarray, out: np.ndarray) -> None:
    """out[...] = narrow(x, out.dtype) with no array in between (out C-contiguous, x's shape): how a block
    of a fused kernel stores its result."""
    if x.dtype == out.dtype:
        out[...] = x
    elif x.dtype == np.float32 and out.dtype in LOW_PRECISION:
        halfconv.astype_into(x, out)
    else:
        out[...] = narrow(x, out.dtype)


def copy_into(x: np.ndarray, out: np.ndarray) -> None:
    """out[...] = x in out's dtype (rounded to nearest as narrow() rounds); a large contiguous copy is
    shared among the rank's threads, block by block, as add() shares a sum."""
    low = x.dtype in LOW_PRECISION or out.dtype in LOW_PRECISION
    if _shared(SHARED_ADD_FROM[low], x, out):
        src, dst = x.reshape(-1), out.reshape(-1)
        thread_pool.run(lambda lo, hi: narrow_into(src[lo:hi], dst[lo:hi]), x.size, 4 * thread_pool.BLOCK)
    else:
        narrow_into(x, out)


def _shared(shared_from: int, first: np.ndarray, *others: np.ndarray | None) -> bool:
    """Whether an elementwise pass over these arrays (None: an output not made yet) goes to the rank's
    threads block by block: more than one thread, at least `shared_from` elements, one shape, every array
    C-contiguous (its blocks are then plain slices of the flattened arrays)."""
    if thread_pool.threads() == 1 or first.size < shared_from or not first.flags.c_contiguous:
        return False
    return all(a is None or (a.shape == first.shape and a.flags.c_contiguous) for a in others)


def _convert(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """a.astype(dtype) through engine.fast.halfconv; a large contiguous array in blocks shared among the
    rank's threads (engine.fast.thread_pool). Only arrays large enough to repay handing work to another thread
    (SHARED_CONVERT_FROM)."""
    if not _shared(SHARED_CONVERT_FROM[halfconv.compiled() is not None], a):
        return halfconv.astype(a, dtype)
    out = np.empty(a.shape, dtype)
    src, dst = a.reshape(-1), out.reshape(-1)

    def block(lo: int, hi: int) -> None:
        halfconv.astype_into(src[lo:hi], dst[lo:hi])
    thread_pool.run(block, src.size, 4 * thread_pool.BLOCK)
    return out


# Elements from which a sum is shared among the rank's threads: below, it costs less than handing half of
# it over. A float32 add runs at memory speed (~0.4 ns per element, measured), a 16-bit one widens and
# rounds (~2-3 ns), so the 16-bit sums repay it sooner.
SHARED_ADD_FROM = {False: 32 * thread_pool.BLOCK, True: 8 * thread_pool.BLOCK}  # by: any 16-bit operand


def add(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """a + b (into `out` when given), bit for bit NumPy's result; any 16-bit operand or `out` is
    computed in float32 (a float16 + float32 sum is float32, as in NumPy). A large sum of two contiguous
    arrays of one shape (the tape's gradient sums) is shared among the rank's threads, block by block."""
    dtypes = (a.dtype, b.dtype) if out is None else (a.dtype, b.dtype, out.dtype)
    low = any(d in LOW_PRECISION for d in dtypes)
    if _shared(SHARED_ADD_FROM[low], a, b, out):
        if out is None:
            out = np.empty(a.shape, np.result_type(a.dtype, b.dtype))
        fa, fb, fo = a.reshape(-1), b.reshape(-1), out.reshape(-1)
        thread_pool.run(lambda lo, hi: _add(fa[lo:hi], fb[lo:hi], fo[lo:hi], low), a.size,
                        4 * thread_pool.BLOCK)
        return out
    if not low:
        return np.add(a, b, out=out)
    wide = widen(a) + widen(b)
    if out is None:
        return narrow(wide, np.result_type(a.dtype, b.dtype))
    out[...] = narrow(wide, out.dtype)
    return out


def _add(a: np.ndarray, b: np.ndarray, out: np.ndarray, low: bool) -> None:
    """out = a + b, as add() computes it (`low`: in float32 on widened operands, rounded once)."""
    if low:
        narrow_into(widen(a) + widen(b), out)
    else:
        np.add(a, b, out=out)
