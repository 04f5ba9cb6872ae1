"""Causal attention in the flash-attention scheme: blocked over query and key tiles, never the [T, T]
probabilities in memory.

Forward, per query tile: the key tiles up to the diagonal (the later ones are all masked: skipped, half the
products), each folded into the rows' running maximum m, running sum l and output accumulator with the
online softmax (rescaled by exp(old m - new m) when the maximum grows); then O = acc / l and the per-row
log-sum-exp LSE = m + log l are kept. Backward recomputes each tile's probabilities exp(s scale - LSE) and
uses d = rowsum(dO O) for the softmax's row sums (sum_j dP_ij P_ij = dO_i . O_i, through dropout too).

Tile products go to BLAS on whole stacks of heads; the per-tile elementwise work is engine.fast.flash_jit
where numba is installed, else the NumPy chain below with the same bits. Work is shared among the rank's
threads by ranges of (batch, head) rows (engine.fast.thread_pool.split); each share copies its rows into
contiguous compute-dtype arrays (16-bit inputs widened exactly), and every head's arithmetic is the same
whoever runs it, so the results do not depend on the number of threads.

Dropout: the mask of a query tile is drawn by its own piece of the site's stream (MaskSite.block, the
words keep_mask reads for those elements), in forward and again in backward: the whole mask is never held.
"""

from __future__ import annotations

import math

import numpy as np

from engine.dropout_rng import MaskSite
from engine.dtypes import compute_dtype
from engine.fast import lowp, thread_pool
from engine.fast.compiled import load

QUERY_TILE = 64  # queries per tile
KEY_TILE = 64  # keys per tile at most: a multiple of QUERY_TILE, so every row of a computed tile sees a key


def forward(q: np.ndarray, k: np.ndarray, v: np.ndarray, site: MaskSite | None, keep_scale, grain: int):
    """(out [B, H, T, Dv] in q's dtype, lse [B, H, T] in the compute dtype) for q, k, v [B, H, T, D]."""
    dtype, cdt = q.dtype, compute_dtype(q.dtype)
    b, h, t, _ = q.shape
    out = np.empty((b, h, t, v.shape[-1]), dtype)
    lse = np.empty((b, h, t), cdt)
    scale = cdt.type(1.0 / math.sqrt(q.shape[-1]))
    jit = load("flash_jit")

    def share(lo: int, hi: int) -> None:
        qs, ks, vs = (_gather(a, lo, hi, cdt) for a in (q, k, v))
        kt, rows, dst = _transposed(ks), lse.reshape(b * h, t)[lo:hi], out.reshape(b * h, t, -1)[lo:hi]
        for i0 in range(0, t, QUERY_TILE):
            i1 = min(t, i0 + QUERY_TILE)
            m = np.full((hi - lo, i1 - i0), -np.inf, cdt)
            shift, keep = np.empty_like(m), _keep(site, lo, hi, h, t, i0, i1)
            for j0 in range(0, i1, KEY_TILE):
                j1 = min(i1, j0 + KEY_TILE)
                s = np.matmul(qs[:, i0:i1], kt[:, :, j0:j1])
                _scores_online(jit, s, scale, i0, j0, m, shift)
                np.exp(s, out=s)
                np.exp(shift, out=shift)
                row_sum = s.sum(-1)
                if keep is not None:
                    _dropped(jit, s, keep[:, :, j0:j1], keep_scale, s)
                pv = np.matmul(s, vs[:, j0:j1])
                if j0 == 0:  # nothing to rescale yet
                    acc, l = pv, row_sum
                else:
                    l *= shift
                    l += row_sum
                    acc *= shift[..., None]
                    acc += pv
            if dtype == cdt:
                np.divide(acc, l[..., None], out=dst[:, i0:i1])
            else:
                acc /= l[..., None]
                dst[:, i0:i1] = lowp.narrow(acc, dtype)
            rows[:, i0:i1] = m + np.log(l)
    thread_pool.split(share, b * h, grain)
    return out, lse


def backward(q, k, v, out, lse, g, site: MaskSite | None, keep_scale, grain: int):
    """(dq, dk, dv) in q's dtype given g = dL/d out, from what forward kept (q, k, v, out, lse)."""
    dtype, cdt = q.dtype, compute_dtype(q.dtype)
    b, h, t, _ = q.shape
    grads = [np.empty(a.shape, dtype) for a in (q, k, v)]
    scale = cdt.type(1.0 / math.sqrt(q.shape[-1]))
    jit = load("flash_jit")

    def share(lo: int, hi: int) -> None:
        qs, ks, vs, os, gs = (_gather(a, lo, hi, cdt) for a in (q, k, v, out, g))
        kt, vt, rows = _transposed(ks), _transposed(vs), lse.reshape(b * h, t)[lo:hi]
        d = (gs * os).sum(-1)
        # float32 and float64 gradients are written in place; 16-bit ones are rounded from float32 at the end
        dq, dk, dv = (_rows_of(full, lo, hi) if dtype == cdt else np.empty((hi - lo, *full.shape[2:]), cdt)
                      for full in grads)
        starts = range(0, t, QUERY_TILE)
        for i0 in reversed(starts):  # the last query tile first: it sees every key, so it starts dk and dv
            i1, first = min(t, i0 + QUERY_TILE), i0 == starts[-1]
            keep = _keep(site, lo, hi, h, t, i0, i1)
            qi, gi, di = qs[:, i0:i1], gs[:, i0:i1], d[:, i0:i1]
            for j0 in range(0, i1, KEY_TILE):
                j1 = min(i1, j0 + KEY_TILE)
                p = np.matmul(qi, kt[:, :, j0:j1])
                _scores_shift(jit, p, scale, i0, j0, rows[:, i0:i1])
                np.exp(p, out=p)
                kj = None if keep is None else keep[:, :, j0:j1]
                pd = p if kj is None else _dropped(jit, p, kj, keep_scale, np.empty_like(p))
                _accumulate(pd.swapaxes(1, 2), gi, dv[:, j0:j1], first)
                ds = np.matmul(gi, vt[:, :, j0:j1])
                _score_grad(jit, ds, p, kj, keep_scale, di, scale)
                _accumulate(ds, ks[:, j0:j1], dq[:, i0:i1], j0 == 0)
                _accumulate(ds.swapaxes(1, 2), qi, dk[:, j0:j1], first)
        if dtype != cdt:
            for grad, full in zip((dq, dk, dv), grads):
                lowp.narrow_into(grad, _rows_of(full, lo, hi))
    thread_pool.split(share, b * h, grain)
    return tuple(grads)


def _accumulate(a: np.ndarray, b: np.ndarray, out: np.ndarray, first: bool) -> None:
    """out = a @ b on the first contribution, out += a @ b after it."""
    if first:
        np.matmul(a, b, out=out)
    else:
        out += np.matmul(a, b)


# ---- rows of a share -------------------------------------------------------------------------------

def _pieces(lo: int, hi: int, heads: int):
    """(batch row, first head, end head, offset in the share) covering flat (batch, head) rows [lo, hi)."""
    n = lo
    while n < hi:
        row, first = divmod(n, heads)
        end = min(heads, first + hi - n)
        yield row, first, end, n - lo
        n += end - first


def _gather(a: np.ndarray, lo: int, hi: int, cdt: np.dtype) -> np.ndarray:
    """Rows [lo, hi) of a [B, H, T, D] as one contiguous [hi - lo, T, D] array in the compute dtype."""
    if a.dtype == cdt and a.flags.c_contiguous:
        return a.reshape(-1, *a.shape[2:])[lo:hi]
    rows = np.empty((hi - lo, *a.shape[2:]), cdt)
    for row, first, end, at in _pieces(lo, hi, a.shape[1]):
        rows[at:at + end - first] = lowp.widen(a[row, first:end])
    return rows


def _rows_of(a: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Rows [lo, hi) of a C-contiguous [B, H, T, D] as a [hi - lo, T, D] view."""
    return a.reshape(-1, *a.shape[2:])[lo:hi]


def _transposed(a: np.ndarray) -> np.ndarray:
    """[n, D, T] copy of a [n, T, D]: the tile products on it take a contiguous right operand, which the
    BLAS runs faster than a transposed view, and the copy is one pass over a share's keys."""
    return np.ascontiguousarray(a.swapaxes(1, 2))


def _keep(site: MaskSite | None, lo: int, hi: int, heads: int, t: int, i0: int, i1: int) -> np.ndarray | None:
    """The keep-mask of queries [i0, i1) against every key for the rows [lo, hi): [hi - lo, i1 - i0, T].
    Mask row = batch row; a head's [T, T] block follows the previous head's in it."""
    if site is None:
        return None
    keep = np.empty((hi - lo, i1 - i0, t), bool)
    for n in range(lo, hi):
        row, head = divmod(n, heads)
        keep[n - lo] = site.block(row, row + 1, (head * t + i0) * t, (head * t + i1) * t).reshape(i1 - i0, t)
    return keep


# ---- the per-tile elementwise work: compiled, or the NumPy chain with the same bits -----------------

def _above(s: np.ndarray, q_off: int, k_off: int) -> np.ndarray:
    """[queries, keys]: True where the key is after the query."""
    return np.arange(k_off, k_off + s.shape[2]) > np.arange(q_off, q_off + s.shape[1])[:, None]


def _scores_online(jit, s, scale, q_off, k_off, m, shift) -> None:
    if jit is not None:
        jit.scores_online(s, scale, q_off, k_off, m, shift, s.dtype.type(-np.inf))
        return
    s *= scale
    np.copyto(s, -np.inf, where=_above(s, q_off, k_off))
    top = np.maximum(m, s.max(-1))
    np.subtract(m, top, out=shift)
    m[...] = top
    s -= top[..., None]


def _scores_shift(jit, s, scale, q_off, k_off, lse) -> None:
    if jit is not None:
        jit.scores_shift(s, scale, q_off, k_off, lse, s.dtype.type(-np.inf))
        return
    s *= scale
    s -= lse[..., None]
    np.copyto(s, -np.inf, where=_above(s, q_off, k_off))


def _dropped(jit, p, keep, keep_scale, out) -> np.ndarray:
    if jit is not None:
        jit.dropped(p, keep, keep_scale, p.dtype.type(1), p.dtype.type(0), out)
        return out
    np.multiply(p, keep, out=out)
    out *= keep_scale
    return out


def _score_grad(jit, dp, p, keep, keep_scale, d, scale) -> None:
    one, zero = dp.dtype.type(1), dp.dtype.type(0)
    if jit is not None and keep is None:
        jit.score_grad(dp, p, d, scale)
    elif jit is not None:
        jit.dropped_score_grad(dp, p, keep, keep_scale, one, zero, d, scale)
    else:
        if keep is not None:
            dp *= keep
            dp *= keep_scale
        dp -= d[..., None]
        dp *= p
        dp *= scale


def warm_up() -> None:
    """Load the compiled loops for float32 now, not inside a measured step. Does nothing without numba."""
    if load("flash_jit") is None:
        return
    x = np.ones((1, 1, 3, 4), np.float32)
    out, lse = forward(x, x, x, None, np.float32(1), 1)
    backward(x, x, x, out, lse, x, None, np.float32(1), 1)
