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

TRANSPOSE_ROWS = 16  # source rows per band: a fixed count the compiler unrolls into vector gathers


@njit(cache=True, nogil=True)
def transposed(src, dst):  # pragma: no cover - compiled
    """dst[a, b, j, i] = src[a, b, i, j] for a 4-D src of any strides (heads: views of a wider array). A band
    of TRANSPOSE_ROWS source rows at a time: each cache line of the band is read once, and each destination
    row gets TRANSPOSE_ROWS contiguous elements per visit."""
    n0, n1, rows, cols = src.shape
    for a in range(n0):
        for b in range(n1):
            s, d = src[a, b], dst[a, b]
            i0 = 0
            while i0 + TRANSPOSE_ROWS <= rows:
                for j in range(cols):
                    dj = d[j]
                    for i in range(TRANSPOSE_ROWS):
                        dj[i0 + i] = s[i0 + i, j]
                i0 += TRANSPOSE_ROWS
            for j in range(cols):
                for i in range(i0, rows):
                    d[j, i] = s[i, j]


@njit(cache=True, nogil=True, inline="always")
def _larger(x, t):  # pragma: no cover - compiled
    """x if x > t else t: t stays where x is not larger (a NaN x never replaces t)."""
    return x if x > t else t


@njit(cache=True, nogil=True, inline="always")
def _row_max(row, seen, start):  # pragma: no cover - compiled
    """The maximum of start and row[:seen], in eight lanes merged at the end: a maximum is exact in any
    order, and independent lanes let the compiler use vector compares (one running maximum is a chain it
    cannot)."""
    t0 = t1 = t2 = t3 = t4 = t5 = t6 = t7 = start
    c = 0
    while c + 8 <= seen:
        t0 = _larger(row[c], t0)
        t1 = _larger(row[c + 1], t1)
        t2 = _larger(row[c + 2], t2)
        t3 = _larger(row[c + 3], t3)
        t4 = _larger(row[c + 4], t4)
        t5 = _larger(row[c + 5], t5)
        t6 = _larger(row[c + 6], t6)
        t7 = _larger(row[c + 7], t7)
        c += 8
    while c < seen:
        t0 = _larger(row[c], t0)
        c += 1
    # pairs, then pairs of pairs: the merges of the eight lanes in the order they always ran
    return _larger(_larger(_larger(t7, t6), _larger(t5, t4)), _larger(_larger(t3, t2), _larger(t1, t0)))


@njit(cache=True, nogil=True)
def scores_online(s, scale, q_off, k_off, m, shift, ninf):  # pragma: no cover - compiled
    """Forward: s = s scale (ninf where the key is after the query); each row's running maximum m raised to
    the tile's (_row_max); s -= the new maximum; shift = old m - new m (its exp rescales the row's running
    sums)."""
    n, bq, bk = s.shape
    for h in range(n):
        for r in range(bq):
            row = s[h, r]
            seen = max(0, min(bk, q_off + r - k_off + 1))
            for c in range(seen):
                row[c] = row[c] * scale
            top = _row_max(row, seen, m[h, r])
            for c in range(seen):
                row[c] = row[c] - top
            for c in range(seen, bk):
                row[c] = ninf
            shift[h, r] = m[h, r] - top
            m[h, r] = top


@njit(cache=True, nogil=True)
def scores_shift(s, scale, q_off, k_off, lse, ninf):  # pragma: no cover - compiled
    """Backward: s = s scale - lse (ninf where the key is after the query); exp of it is the tile of the
    probabilities forward computed, from the row's saved log-sum-exp."""
    n, bq, bk = s.shape
    for h in range(n):
        for r in range(bq):
            row, top = s[h, r], lse[h, r]
            seen = max(0, min(bk, q_off + r - k_off + 1))
            for c in range(seen):
                row[c] = row[c] * scale - top
            for c in range(seen, bk):
                row[c] = ninf


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
            row, prob, dr = dp[h, r], p[h, r], d[h, r]
            for c in range(bk):
                row[c] = (row[c] - dr) * prob[c] * scale


@njit(cache=True, nogil=True)
def dropped_score_grad(dp, p, keep, keep_scale, one, zero, d, scale):  # pragma: no cover - compiled
    """In place: dp = (dp keep keep_scale - d) p scale, the softmax backward through dropout."""
    n, bq, bk = dp.shape
    for h in range(n):
        for r in range(bq):
            for c in range(bk):
                x = dp[h, r, c] * (one if keep[h, r, c] else zero) * keep_scale
                dp[h, r, c] = (x - d[h, r]) * p[h, r, c] * scale
