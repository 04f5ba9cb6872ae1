"""float16 <-> float32 conversion, bit for bit what `astype` gives, ~4x (up) and ~4x (down) faster.

NumPy's wheels convert halves one element at a time in software (their baseline has no F16C), at
~1.6-3 ns per element up and ~2.5-6 ns down: in fp16 training those casts cost more than the matrix
products they feed (engine.ops.matmul_kernel). Where numba is installed (a core dependency), the
compiled loops of engine.fast.halfconv_jit do the work; otherwise, and for tests of both, NumPy does it:

- up: a 65536-entry table of every half's float32 value (built by astype itself), gathered with the
  half's bits as the index.
- down: vectorised integer steps, in cache-sized chunks, with the rounding (to nearest, ties to even)
  done by the FPU: adding C = 2^13 x the power of two of |x| (at least 2^-14, where the half grid stops
  shrinking) leaves |x| rounded to C's ulp, which is the half's ulp, in the low bits of the sum. NaNs
  (rare: an overflowing step) are converted by astype itself, so their payloads match too.

Both return arrays laid out as astype lays them out (`np.empty_like`, order "K"), since a matrix
product's rounding can depend on its operands' layout. tests/exhaustive_halfconv.py (run by hand) checks
both against astype on every input; tests/fast/test_halfconv.py on samples, every rounding tie and specials.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from engine.fast.compiled import load

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
_UP = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
_UP.flags.writeable = False
_UP_BITS = _UP.view(np.uint32)
_CHUNK = 1 << 16  # elements per pass of the downcast (its scratch, ~1.25 MiB, stays in L2/L3)
_SMALL = 1 << 12  # below this, per-call overhead outweighs the gain: plain astype
_FLOOR = np.full(_CHUNK, 113 << 23, np.uint32)  # float32 exponent field of 2^-14, the smallest normal half
_INF = np.full(_CHUNK, 0x7C00, np.uint32)  # half +inf
for _const in (_FLOOR, _INF):
    _const.flags.writeable = False


def astype(a: np.ndarray, dtype, copy: bool = False) -> np.ndarray:
    """a.astype(dtype, copy=copy), bit for bit, with float16 <-> float32 and float32 -> bfloat16 done here
    (and an overflow to inf raising no warning: in fp16 training that is the loss scaler's business)."""
    dtype = np.dtype(dtype)
    if a.dtype == np.float16 and dtype == np.float32:
        return to_float32(a)
    if a.dtype == np.float32 and dtype == np.float16:
        return to_float16(a)
    if a.dtype == np.float32 and dtype == BFLOAT16:
        return to_bfloat16(a)
    if a.dtype == BFLOAT16 and dtype == np.float32:
        return bfloat16_to_float32(a)
    return a.astype(dtype, copy=copy)


def astype_into(a: np.ndarray, out: np.ndarray) -> None:
    """out[...] = a.astype(out.dtype), bit for bit, without the new array astype makes (a block of a
    fused kernel writes its rounded result straight into its slice of the output). Both of one shape,
    `out` C-contiguous; overflow to inf without a warning."""
    jit = compiled() if a.size >= _SMALL and a.flags.c_contiguous and out.flags.c_contiguous else None
    pair = (a.dtype, out.dtype)
    if jit is not None and pair in _LOOPS:
        loop, src_bits, dst_bits, args = _loop(jit, pair)
        loop(a.reshape(-1).view(src_bits), *args, out.reshape(-1).view(dst_bits))
        return
    with np.errstate(over="ignore"):
        out[...] = astype(a, out.dtype)


# (from, to) -> (engine.fast.halfconv_jit's loop, source bits, result bits, whether it takes the widening
# table)
_LOOPS = {(np.dtype(np.float16), np.dtype(np.float32)): ("widen_bits", np.uint16, np.uint32, True),
          (np.dtype(np.float32), np.dtype(np.float16)): ("round_bits", np.uint32, np.uint16, False),
          (BFLOAT16, np.dtype(np.float32)): ("widen_bits_bf16", np.uint16, np.uint32, False),
          (np.dtype(np.float32), BFLOAT16): ("round_bits_bf16", np.uint32, np.uint16, False)}


def _loop(jit, pair: tuple) -> tuple:
    """(compiled loop, source bits, result bits, the loop's extra arguments) of a (from, to) pair."""
    name, src_bits, dst_bits, with_table = _LOOPS[pair]
    return getattr(jit, name), src_bits, dst_bits, (_UP_BITS,) if with_table else ()


def compiled():
    """engine.fast.halfconv_jit, or None where numba is not installed (engine.fast.compiled)."""
    return load("halfconv_jit")


def to_float32(a: np.ndarray, use_compiled: bool = True) -> np.ndarray:
    """float16 `a` as float32 (as a.astype(np.float32)); `use_compiled=False` forces the NumPy path."""
    if a.size < _SMALL:
        return a.astype(np.float32)
    jit = compiled() if use_compiled else None
    return _to_float32_numpy(a) if jit is None else _run_compiled(jit, a, np.float32)


def _to_float32_numpy(a: np.ndarray) -> np.ndarray:
    """to_float32 on NumPy (no numba, or use_compiled=False): each half's float32 value looked up in _UP."""
    out = np.empty_like(a, dtype=np.float32)
    src, dst = _in_memory_order(a, out)
    src16, dst = src.reshape(-1).view(np.uint16), dst.reshape(-1)  # reshape: a copy only when strided
    for lo in range(0, src16.size, _CHUNK):  # in chunks: take's index temporary stays in cache
        np.take(_UP, src16[lo:lo + _CHUNK], out=dst[lo:lo + _CHUNK], mode="wrap")  # indices in range
    return out


def to_float16(x: np.ndarray, use_compiled: bool = True) -> np.ndarray:
    """float32 `x` rounded to float16 (as x.astype(np.float16), overflow to inf without a warning);
    `use_compiled=False` forces the NumPy path."""
    if x.size < _SMALL:
        with np.errstate(over="ignore"):
            return x.astype(np.float16)
    jit = compiled() if use_compiled else None
    return _to_float16_numpy(x) if jit is None else _run_compiled(jit, x, np.float16)


def _to_float16_numpy(x: np.ndarray) -> np.ndarray:
    """to_float16 on NumPy (no numba, or use_compiled=False): vectorised integer steps (_round), chunk by
    chunk."""
    out = np.empty_like(x, dtype=np.float16)
    src, dst = _in_memory_order(x, out)
    src = np.ascontiguousarray(src).reshape(-1).view(np.uint32)
    dst = dst.reshape(-1).view(np.uint16)
    n = min(_CHUNK, src.size)
    mag, exp, low = np.empty(n, np.uint32), np.empty(n, np.uint32), np.empty(n, np.uint32)
    with np.errstate(over="ignore", invalid="ignore"):
        for lo in range(0, src.size, n):
            k = min(n, src.size - lo)
            _round(src[lo:lo + k], dst[lo:lo + k], mag[:k], exp[:k], low[:k], _FLOOR[:k], _INF[:k])
    return out


def to_bfloat16(x: np.ndarray, use_compiled: bool = True) -> np.ndarray:
    """float32 `x` rounded to bfloat16, as ml_dtypes' x.astype(bfloat16) (which is the path without numba)."""
    jit = compiled() if use_compiled else None
    if jit is None or x.size < _SMALL:
        with np.errstate(over="ignore"):
            return x.astype(BFLOAT16)
    return _run_compiled(jit, x, BFLOAT16)


def bfloat16_to_float32(a: np.ndarray, use_compiled: bool = True) -> np.ndarray:
    """bfloat16 `a` as float32, as ml_dtypes' a.astype(np.float32) (the path without numba)."""
    jit = compiled() if use_compiled else None
    if jit is None or a.size < _SMALL:
        return a.astype(np.float32)
    return _run_compiled(jit, a, np.float32)


def _run_compiled(jit, a: np.ndarray, dtype) -> np.ndarray:
    """a.astype(dtype) through the pair's compiled loop (_LOOPS) on both arrays' bits, flat, into a new
    array laid out as astype lays it out. A C-contiguous `a` (the common case) skips the layout steps:
    their few microseconds are a third of a conversion of a block."""
    loop, src_bits, dst_bits, args = _loop(jit, (a.dtype, np.dtype(dtype)))
    if a.flags.c_contiguous:
        out = np.empty(a.shape, dtype)
        loop(a.reshape(-1).view(src_bits), *args, out.reshape(-1).view(dst_bits))
        return out
    out = np.empty_like(a, dtype=dtype)
    src, dst = _in_memory_order(a, out)
    loop(np.ascontiguousarray(src).reshape(-1).view(src_bits), *args, dst.reshape(-1).view(dst_bits))
    return out


def _round(u, h, mag, exp, low, floor, inf) -> None:
    """Half bits `h` of the float32 bits `u`, with scratch mag, exp, low. floor and inf are constant
    arrays: NumPy's max/min against an array run ~3x faster than against a scalar."""
    np.bitwise_and(u, 0x7FFFFFFF, out=mag)  # |x|
    np.bitwise_and(mag, 0x7F800000, out=exp)
    np.maximum(exp, floor, out=exp)  # the power of two whose ulp / 2^13 is the half's ulp
    np.add(exp, 13 << 23, out=low)  # C (overflows for huge |x|; their result is clamped below)
    np.add(mag.view(np.float32), low.view(np.float32), out=low.view(np.float32))  # the FPU rounds here
    np.bitwise_and(low, 0xFFF, out=low)  # rounded |x| in half ulps: 0x400 + mantissa, or 0x800 carried
    np.subtract(exp, floor, out=exp)
    np.right_shift(exp, 13, out=exp)  # (exponent + 14) << 10: 0 for subnormals
    np.add(exp, low, out=exp)
    np.minimum(exp, inf, out=exp)  # 65520 and above round to inf
    np.right_shift(u, 16, out=low)
    np.bitwise_and(low, 0x8000, out=low)  # the sign
    np.bitwise_or(exp, low, out=exp)
    np.copyto(h, exp, casting="unsafe")
    if mag.max() > 0x7F800000:  # NaNs: as NumPy converts them (payload kept)
        nan = mag > 0x7F800000
        h[nan] = u[nan].view(np.float32).astype(np.float16).view(np.uint16)


def _in_memory_order(src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both arrays with their axes permuted so that `dst` (dense, from np.empty_like) is C-contiguous:
    the element-for-element pairing is unchanged and `dst` can be written as one flat run."""
    if dst.flags.c_contiguous:
        return src, dst
    order = sorted(range(dst.ndim), key=lambda axis: -dst.strides[axis])
    return src.transpose(order), dst.transpose(order)
