"""The fused attention's per-tile elementwise work as compiled loops (numba): engine.fast.flash's fast path.

Why compiled: a score tile's scaling, causal masking, row maximum and shift are four NumPy passes (with a
boolean-indexed store), the score gradient five; one loop each does them in registers. exp stays NumPy's
(vectorised; a compiled exp is a scalar libm call per element) and so do the row sums, so the loops only
multiply, add, compare and store: each element sees the NumPy chain's operations in its order, and the
results are the NumPy chain's bit for bit (engine.fast.flash keeps that chain for a machine without numba).

Tiles are [heads, queries, keys] with the queries from q_off and the keys from k_off; a key after its query
is masked. Constants come in as arguments of the arrays' dtype: a Python literal would promote float32
arithmetic to float64.
"""

from __future__ import annotations

from numba import njit


@njit(cache=True, nogil=True)
def scores_online(s, scale, q_off, k_off, m, shift, ninf):  # pragma: no cover - compiled
    """Forward: s = s scale (ninf where the key is after the query); each row's running maximum m raised to
    the tile's; s -= the new maximum; shift = old m - new m (its exp rescales the row's running sums)."""
    n, bq, bk = s.shape
    for h in range(n):
        for r in range(bq):
            seen = max(0, min(bk, q_off + r - k_off + 1))
            top = m[h, r]
            for c in range(seen):
                x = s[h, r, c] * scale
                s[h, r, c] = x
                if x > top:
                    top = x
            for c in range(seen):
                s[h, r, c] -= top
            for c in range(seen, bk):
                s[h, r, c] = ninf
            shift[h, r] = m[h, r] - top
            m[h, r] = top


@njit(cache=True, nogil=True)
def scores_shift(s, scale, q_off, k_off, lse, ninf):  # pragma: no cover - compiled
    """Backward: s = s scale - lse (ninf where the key is after the query); exp of it is the tile of the
    probabilities forward computed, from the row's saved log-sum-exp."""
    n, bq, bk = s.shape
    for h in range(n):
        for r in range(bq):
            seen = max(0, min(bk, q_off + r - k_off + 1))
            for c in range(seen):
                s[h, r, c] = s[h, r, c] * scale - lse[h, r]
            for c in range(seen, bk):
                s[h, r, c] = ninf


@njit(cache=True, nogil=True)
def dropped(p, keep, keep_scale, one, zero, out):  # pragma: no cover - compiled
    """out = p keep keep_scale (keep as 1 or 0): the probabilities after dropout."""
    n, bq, bk = p.shape
    for h in range(n):
        for r in range(bq):
            for c in range(bk):
                out[h, r, c] = p[h, r, c] * (one if keep[h, r, c] else zero) * keep_scale


@njit(cache=True, nogil=True)
def score_grad(dp, p, d, scale):  # pragma: no cover - compiled
    """In place: dp = (dp - d) p scale, the softmax backward given d = the row sums of dO O."""
    n, bq, bk = dp.shape
    for h in range(n):
        for r in range(bq):
            for c in range(bk):
                dp[h, r, c] = (dp[h, r, c] - d[h, r]) * p[h, r, c] * scale


@njit(cache=True, nogil=True)
def dropped_score_grad(dp, p, keep, keep_scale, one, zero, d, scale):  # pragma: no cover - compiled
    """In place: dp = (dp keep keep_scale - d) p scale, the softmax backward through dropout."""
    n, bq, bk = dp.shape
    for h in range(n):
        for r in range(bq):
            for c in range(bk):
                x = dp[h, r, c] * (one if keep[h, r, c] else zero) * keep_scale
                dp[h, r, c] = (x - d[h, r]) * p[h, r, c] * scale
