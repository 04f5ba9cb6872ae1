"""float16 <-> float32 (and float32 -> bfloat16) as compiled loops (numba): engine.fast.halfconv's fast path.

Why compiled: NumPy's wheels convert halves one element at a time in software, and the best NumPy can
do instead (a table gather, thirteen integer passes down) still costs 1.2-4 ns per element, about half
of an fp16 training step. One loop per direction, compiled for this CPU, does it in one pass:

- Where the CPU converts halves itself (x86's F16C, which every x86 CPU since 2013 has): LLVM's own
  half <-> float conversions, which become the vector instructions (vcvtph2ps, vcvtps2ph: ~0.3-0.4 ns per
  element). They round as NumPy does (to nearest, ties to even, subnormals kept); only NaNs differ (the
  hardware quiets a signalling NaN and drops payload bits NumPy keeps), so NaNs take NumPy's rule in the
  same loop, branch-free.
- Elsewhere: integer steps the loop vectorises. Up: the 65536-entry table of every half's float32 bits
  (astype's own), gathered by the half's bits. Down: the float32 bits rounded to the half's 10 mantissa
  bits (to nearest, ties to even): normal halves add 0xFFF plus the kept bit's parity, then drop 13
  bits and rebase the exponent; subnormal halves shift the full 24-bit mantissa right by 14-25 places
  and round on the bits shifted out; 65520 and above give inf.
- NaNs, as NumPy converts them: down, the top 10 payload bits (a payload that would vanish becomes 1);
  up, the payload shifted into place, quiet bit as it was.
- bfloat16 down: as ml_dtypes' cast (its own ~1 ns per element is the rest of a bf16 step's rounding
  cost): add 0x7FFF plus the kept bit's parity, drop 16 bits; a NaN becomes the quiet NaN 0x7FC0 with its
  sign. Up: the 16 bits shifted into the top half (ml_dtypes' cast does the same, but each call through
  NumPy's casting costs ~10 microseconds more, a third of a block's conversion).

tests/fast/test_halfconv.py checks the loops against astype (every half up; samples, every rounding tie
and the special values down); tests/exhaustive_halfconv.py every float32 input, by hand.
"""

from __future__ import annotations

import numpy as np
from llvmlite import binding, ir
from numba import njit, types
from numba.extending import intrinsic

_U = np.uint32
HAS_F16C = bool(binding.get_host_cpu_features().get("f16c", False))


def _llvm_conversion(convert: str, from_float, to_int, signature):
    """A numba intrinsic: the bits of one float type, reinterpreted, converted by LLVM's `convert`
    instruction (fpext or fptrunc) to the other float type, whose bits it returns."""
    @intrinsic
    def conversion(typingctx, bits):  # pragma: no cover - compiled
        def codegen(context, builder, sig, args):
            value = getattr(builder, convert)(builder.bitcast(args[0], from_float), to_float)
            return builder.bitcast(value, to_int)
        return signature, codegen
    to_float = ir.HalfType() if from_float == ir.FloatType() else ir.FloatType()
    return conversion


# LLVM's fpext (F16C's vcvtph2ps) and fptrunc (vcvtps2ph, to nearest even) on the bits of halves and floats
_half_to_float_bits = _llvm_conversion("fpext", ir.HalfType(), ir.IntType(32), types.uint32(types.uint16))
_float_bits_to_half = _llvm_conversion("fptrunc", ir.FloatType(), ir.IntType(16), types.uint16(types.uint32))


def _bitcast(from_type, to_type, signature):
    """A numba intrinsic: a scalar's bits reinterpreted as another type of the same width."""
    @intrinsic
    def bitcast(typingctx, value):  # pragma: no cover - compiled
        def codegen(context, builder, sig, args):
            return builder.bitcast(args[0], to_type)
        return signature, codegen
    return bitcast


float_from_bits = _bitcast(ir.IntType(32), ir.FloatType(), types.float32(types.uint32))
bits_of_float = _bitcast(ir.FloatType(), ir.IntType(32), types.uint32(types.float32))


# One element each way, inlined into every loop that converts (these below, and engine.fast.kernels_jit's
# fused 16-bit kernels, which read and write 16-bit arrays directly).

@njit(cache=True, nogil=True, inline="always")
def half_to_float_bits(half):  # pragma: no cover - compiled
    """The float32 bits of half bits `half`, by the CPU; NaNs as NumPy widens them."""
    h = _U(half)
    nan = ((h & _U(0x7C00)) == _U(0x7C00)) & ((h & _U(0x3FF)) != _U(0))
    numpy_nan = ((h & _U(0x8000)) << _U(16)) | _U(0x7F800000) | ((h & _U(0x3FF)) << _U(13))
    return numpy_nan if nan else _half_to_float_bits(half)


@njit(cache=True, nogil=True, inline="always")
def float_bits_to_half(x):  # pragma: no cover - compiled
    """The half bits of float32 bits `x`, by the CPU; NaNs as NumPy rounds them."""
    a = x & _U(0x7FFFFFFF)
    payload = (a & _U(0x7FFFFF)) >> _U(13)
    sign = (x >> _U(16)) & _U(0x8000)
    numpy_nan = np.uint16((_U(0x7C00) + (payload if payload != _U(0) else _U(1))) | sign)
    return numpy_nan if a > _U(0x7F800000) else _float_bits_to_half(x)


@njit(cache=True, nogil=True, inline="always")
def bf16_to_float_bits(half):  # pragma: no cover - compiled
    """The float32 bits of bfloat16 bits `half`: their top 16 bits (as ml_dtypes widens)."""
    return _U(half) << _U(16)


@njit(cache=True, nogil=True, inline="always")
def float_bits_to_bf16(x):  # pragma: no cover - compiled
    """The bfloat16 bits of float32 bits `x` as ml_dtypes rounds them (overflow carries into inf)."""
    rounded = (x + _U(0x7FFF) + ((x >> _U(16)) & _U(1))) >> _U(16)
    nan = ((x >> _U(16)) & _U(0x8000)) | _U(0x7FC0)
    return np.uint16(nan if (x & _U(0x7FFFFFFF)) > _U(0x7F800000) else rounded)


@njit(cache=True, nogil=True, inline="always")
def widen16(half, bf16):  # pragma: no cover - compiled
    """The float32 value of 16-bit bits `half`: bfloat16's when `bf16`, else float16's (F16C)."""
    return float_from_bits(bf16_to_float_bits(half) if bf16 else half_to_float_bits(half))


@njit(cache=True, nogil=True, inline="always")
def narrow16(value, bf16):  # pragma: no cover - compiled
    """The 16-bit bits of float32 `value` rounded once: to bfloat16 when `bf16`, else to float16 (F16C)."""
    x = bits_of_float(value)
    return float_bits_to_bf16(x) if bf16 else float_bits_to_half(x)


@njit(cache=True, nogil=True)
def _widen_hw(halves, table, out):  # pragma: no cover - compiled
    """out[i] = float32 bits of half halves[i], by the CPU; NaNs as NumPy widens them."""
    for i in range(halves.size):
        out[i] = half_to_float_bits(halves[i])


@njit(cache=True, nogil=True)
def _round_hw(bits, out):  # pragma: no cover - compiled
    """out[i] = the half bits of float32 bits[i], by the CPU; NaNs as NumPy rounds them."""
    for i in range(bits.size):
        out[i] = float_bits_to_half(bits[i])


@njit(cache=True, nogil=True)
def _widen_table(halves, table, out):  # pragma: no cover - compiled; tests call it through halfconv
    """out[i] = table[halves[i]]: uint16 half bits to their float32 bits."""
    for i in range(halves.size):
        out[i] = table[halves[i]]


@njit(cache=True, nogil=True)
def _round_integer(bits, out):  # pragma: no cover - compiled; tests call it through halfconv
    """out[i] = the half bits of float32 bits[i], rounded to nearest, ties to even."""
    for i in range(bits.size):
        x = bits[i]
        a = x & _U(0x7FFFFFFF)
        normal = ((a + _U(0xFFF) + ((a >> _U(13)) & _U(1))) >> _U(13)) - _U(112 << 10)
        shift = _U(min(max(np.int32(126) - np.int32(a >> _U(23)), np.int32(14)), np.int32(25)))
        mantissa = (a & _U(0x7FFFFF)) | _U(0x800000)
        sub = mantissa >> shift
        rest = mantissa & ((_U(1) << shift) - _U(1))
        half_way = _U(1) << (shift - _U(1))
        sub += _U((rest > half_way) | ((rest == half_way) & ((sub & _U(1)) == _U(1))))
        h = normal if a >= _U(0x38800000) else sub  # 2^-14: the smallest normal half
        h = _U(0x7C00) if a >= _U(0x477FF000) else h  # 65520 and above (and inf): inf
        payload = (a & _U(0x7FFFFF)) >> _U(13)
        h = (_U(0x7C00) + (payload if payload != _U(0) else _U(1))) if a > _U(0x7F800000) else h
        out[i] = np.uint16(h | ((x >> _U(16)) & _U(0x8000)))


@njit(cache=True, nogil=True)
def widen_bits_bf16(halves, out):  # pragma: no cover - compiled; tests call it through halfconv
    """out[i] = the float32 bits of bfloat16 bits halves[i]: their top 16 bits (as ml_dtypes widens)."""
    for i in range(halves.size):
        out[i] = bf16_to_float_bits(halves[i])


@njit(cache=True, nogil=True)
def round_bits_bf16(bits, out):  # pragma: no cover - compiled; tests call it through halfconv
    """out[i] = the bfloat16 bits of float32 bits[i] as ml_dtypes rounds them (overflow carries into inf)."""
    for i in range(bits.size):
        out[i] = float_bits_to_bf16(bits[i])


# widen_bits(halves uint16, table uint32, out uint32) and round_bits(bits uint32, out uint16): the CPU's
# conversions where it has them, the integer loops elsewhere (also for tests: _widen_table, _round_integer).
widen_bits, round_bits = (_widen_hw, _round_hw) if HAS_F16C else (_widen_table, _round_integer)
