"""tanh in float32 as a rational function, for GELU (engine.fast.kernels, kernels_jit).

tanh(u) ~ p(u) / q(u), p odd of degree 13 and q even of degree 6, with u clamped to +-CLAMP, where the
ratio reaches +-1 in float32, and u itself below TINY, where tanh(u) = u - u^3/3 rounds to u (and p(u)
would lose digits to underflow near the smallest floats): the approximation Eigen uses for float32
tanh. Evaluated in float32 without fused multiply-adds (Horner, in the order below), it is within 6 ulp
of the true tanh over float32 (5.7 at most, measured by tests/fast/test_tanh32.py; NumPy's own tanh is
within ~1.4), far inside GPT-2's tanh approximation of GELU itself. It keeps +-0, +-1 at +-inf and NaN.

Why not NumPy's tanh: that is a pass of its own over memory. This one is a few multiply-adds and one
division on the CPU's widest vector registers, so GELU's compiled loop computes it in the same pass as its
argument and its output (one read of x, one write), and the NumPy chain (`tanh_numpy`) does the same
operations in the same order: every way of computing GELU gives the same bits. float64 keeps NumPy's tanh.
"""

from __future__ import annotations

import numpy as np

CLAMP = 7.90531110763549805
TINY = 0.0004
# p(u) = u (a1 + a3 u^2 + ... + a13 u^12), q(u) = b0 + b2 u^2 + b4 u^4 + b6 u^6
P = (4.89352455891786e-03, 6.37261928875436e-04, 1.48572235717979e-05, 5.12229709037114e-08,
     -8.60467152213735e-11, 2.00018790482477e-13, -2.76076847742355e-16)
Q = (4.89352518554385e-03, 2.26843463243900e-03, 1.18534705686654e-04, 1.19825839466702e-06)


def coefficients() -> tuple:
    """(CLAMP, TINY, a1 ... a13, b0 ... b6), each a float32: the compiled loops take them as one argument."""
    return tuple(np.float32(v) for v in (CLAMP, TINY, *P, *Q))


def tanh_numpy(u: np.ndarray) -> np.ndarray:
    """tanh of a float32 array, in place, as the compiled loops compute it (kernels_jit.tanh32)."""
    clamp, tiny, a1, a3, a5, a7, a9, a11, a13, b0, b2, b4, b6 = coefficients()
    small = np.abs(u) < tiny  # false for NaN
    np.minimum(np.maximum(u, -clamp, out=u), clamp, out=u)  # NaN stays NaN, as the loops' comparisons keep it
    u2 = u * u
    p = u2 * a13
    for a in (a11, a9, a7, a5, a3):
        p += a
        p *= u2
    p += a1
    p *= u
    q = u2 * b6
    for b in (b4, b2):
        q += b
        q *= u2
    q += b0
    np.divide(p, q, out=p)
    np.copyto(u, p, where=~small)
    return u
