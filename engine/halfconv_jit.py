"""float16 <-> float32 (and float32 -> bfloat16) as compiled loops (numba): engine.halfconv's fast path.

Why compiled: NumPy's wheels convert halves one element at a time in software, and the best NumPy can
do instead (a table gather, thirteen integer passes down) still costs 1.2-4 ns per element, about half
of an fp16 training step. One loop per direction, compiled for this CPU, runs the same integer steps in
its vector registers in one pass over memory: ~0.5 ns up, ~1 ns down.

- up: the 65536-entry table of every half's float32 value (astype's own), gathered by the half's bits.
- down: the float32 bits rounded to the half's 10 mantissa bits (to nearest, ties to even) in integers,
  written branch-free so that the loop vectorises: normal halves add 0xFFF plus the kept bit's parity,
  then drop 13 bits and rebase the exponent; subnormal halves shift the full 24-bit mantissa right by
  14-25 places and round on the bits shifted out; 65520 and above give inf; NaNs keep their top 10
  payload bits (a payload that would vanish becomes 1), as NumPy converts them.

- bfloat16 down: as ml_dtypes' cast (its own ~1 ns per element is the rest of a bf16 step's rounding
  cost); up stays ml_dtypes' (already a vectorised shift).

tests/test_halfconv.py checks the loops against astype (every half up; samples, every rounding tie
and the special values down); tests/exhaustive_halfconv.py every float32 input, by hand.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_U = np.uint32


@njit(cache=True, nogil=True)
def widen_bits(halves, table, out):  # pragma: no cover - compiled; tests call it through halfconv
    """out[i] = table[halves[i]]: uint16 half bits to their float32 values."""
    for i in range(halves.size):
        out[i] = table[halves[i]]


@njit(cache=True, nogil=True)
def round_bits(bits, out):  # pragma: no cover - compiled; tests call it through halfconv
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
def round_bits_bf16(bits, out):  # pragma: no cover - compiled; tests call it through halfconv
    """out[i] = the bfloat16 bits of float32 bits[i] as ml_dtypes rounds them: to nearest, ties to even
    (add 0x7FFF plus the kept bit's parity, drop 16 bits; overflow carries into inf); a NaN becomes the
    quiet NaN 0x7FC0 with its sign."""
    for i in range(bits.size):
        x = bits[i]
        rounded = (x + _U(0x7FFF) + ((x >> _U(16)) & _U(1))) >> _U(16)
        nan = ((x >> _U(16)) & _U(0x8000)) | _U(0x7FC0)
        out[i] = np.uint16(nan if (x & _U(0x7FFFFFFF)) > _U(0x7F800000) else rounded)
