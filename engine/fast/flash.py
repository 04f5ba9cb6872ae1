"""Causal attention in the flash-attention scheme: blocked over query tiles, never the [T, T] probabilities of
all heads in memory.

Forward, per query tile: one product against the keys up to the diagonal (the later ones are all masked:
skipped), a row maximum m, exp, the row sums l, and O = P V / l; the per-row log-sum-exp LSE = m + log l is
kept with O. A causal prefix longer than one product's span of keys (_key_span) is taken a span at a time,
folded together with the online softmax (the running sums rescaled by exp(old m - new m) when the maximum
grows). Backward recomputes each tile's probabilities exp(s scale - LSE) and uses d = rowsum(dO O) for the
softmax's row sums (sum_j dP_ij P_ij = dO_i . O_i, through dropout too).

Layout: q, k, v, the output and the gradients are [B, H, T, D] views of any strides: nn.CausalSelfAttention's
are the heads inside its [B, T, 3C] projection and its [B, T, C] output, read and written in place (BLAS
takes a strided matrix as it is). Keys and values are copied once per group of heads into the layouts the
products read fastest as right operands: K transposed ([D, T]) for the scores, V contiguous for P V; in
backward V transposed for dP and K contiguous for dQ.

Work is shared among the rank's threads by ranges of (batch, head) rows (engine.fast.thread_pool.split);
a share runs its rows in groups of heads (GROUP_BYTES), one NumPy call per tile for the whole group. Every
head's arithmetic is the same whoever runs it and whatever group it is in, so the results do not depend
on the number of threads. 16-bit inputs are widened exactly and computed in
float32; only the output and the gradients are rounded.

Tile products go to BLAS; the per-tile elementwise work is engine.fast.flash_jit where numba is installed,
else the NumPy chain below with the same bits.

Dropout: the mask of a query tile is drawn by its own piece of the site's stream (MaskSite.block, the
words keep_mask reads for those elements), in forward and again in backward: the whole mask is never held.
"""

from __future__ import annotations

import math

import numpy as np

from engine.dropout_rng import MaskSite
from engine.fast import lowp, thread_pool
from engine.fast.compiled import load

QUERY_TILE = 64  # queries per tile
# Multiply-adds per tile product at most. OpenBLAS (NumPy's) runs a product up to this size with its direct
# small-matrix kernel: no packing, no zeroing of the output, on the calling thread. A larger one is packed and
# may be split over BLAS's own threads, which then compete with the rank's other share of the heads.
SMALL_PRODUCT = 10**6
# A group of heads' copy of its keys at most (each tile's NumPy calls run on the whole group: the fewer the
# groups, the fewer the calls, which two threads otherwise take turns to make under the GIL).
GROUP_BYTES = 2 << 20

Group = tuple[slice, slice]  # (batch rows, heads): a rectangle of (batch, head) rows


def forward(q, k, v, out, lse, site: MaskSite | None, keep_scale, grain: int) -> None:
    """Writes out [B, H, T, Dv] (q's dtype) and lse [B, H, T] (C-contiguous, the compute dtype) for q, k, v
    [B, H, T, D] (v: Dv); q, k, v and out are views of any strides."""
    cdt, (b, h, t, d) = lse.dtype, q.shape
    scale = cdt.type(1.0 / math.sqrt(d))
    jit = load("flash_jit")
    span = _key_span(d)

    def group(at: Group) -> None:
        _forward_group(jit, _operand(q[at], cdt), _transposed(jit, k[at], cdt), _contiguous(v[at], cdt),
                       out[at], lse[at], _Mask(site, at, t), keep_scale, scale, span)
    _run_groups(group, b, h, _group_heads(t, d, cdt), grain)


def _forward_group(jit, q, kt, v, out, lse, mask: _Mask, keep_scale, scale, span: int) -> None:
    cdt, t = kt.dtype, q.shape[2]
    for i0 in range(0, t, QUERY_TILE):
        i1 = min(t, i0 + QUERY_TILE)
        m = np.full((*q.shape[:2], i1 - i0), -np.inf, cdt)
        shift, keep = np.empty_like(m), mask.tile(i0, i1)
        for j0 in range(0, i1, span):
            j1 = min(i1, j0 + span)
            s = np.matmul(q[:, :, i0:i1], kt[..., j0:j1])
            _scores_online(jit, s, scale, i0, j0, m, shift)
            np.exp(s, out=s)
            row_sum = s.sum(-1)
            if keep is not None:
                _dropped(jit, s, keep[..., j0:j1], keep_scale, s)
            pv = np.matmul(s, v[:, :, j0:j1])
            if j0 == 0:  # nothing to rescale yet
                acc, l = pv, row_sum
            else:
                np.exp(shift, out=shift)
                l *= shift
                l += row_sum
                acc *= shift[..., None]
                acc += pv
        dst = out[:, :, i0:i1]
        if dst.dtype == cdt:
            np.divide(acc, l[..., None], out=dst)
        else:
            acc /= l[..., None]
            dst[...] = lowp.narrow(acc, dst.dtype)
        lse[:, :, i0:i1] = m + np.log(l)


def backward(q, k, v, out, lse, g, dq, dk, dv, site: MaskSite | None, keep_scale, grain: int) -> None:
    """Writes dq, dk, dv (views of any strides, q's dtype) given g = dL/d out (a view), from what forward
    kept (q, k, v, out, lse)."""
    cdt, (b, h, t, d) = lse.dtype, q.shape
    scale = cdt.type(1.0 / math.sqrt(d))
    jit = load("flash_jit")
    span = _key_span(d)

    def group(at: Group) -> None:
        grads = (dq[at], dk[at], dv[at])
        # float32 and float64 gradients are written in place; 16-bit ones rounded from float32 at the end
        work = grads if dq.dtype == cdt else tuple(np.empty(a.shape, cdt) for a in grads)
        gs = _operand(g[at], cdt)
        rows = np.einsum("...i,...i->...", gs, _operand(out[at], cdt))
        _backward_group(jit, _operand(q[at], cdt), _transposed(jit, k[at], cdt), _contiguous(k[at], cdt),
                        _transposed(jit, v[at], cdt), gs, rows, lse[at], work, _Mask(site, at, t),
                        keep_scale, scale, span)
        if work is not grads:
            for done, full in zip(work, grads):
                full[...] = lowp.narrow(done, full.dtype)
    _run_groups(group, b, h, _group_heads(t, d, cdt), grain)


def _backward_group(jit, q, kt, k, vt, g, d, lse, grads, mask: _Mask, keep_scale, scale, span: int) -> None:
    dq, dk, dv = grads
    t = q.shape[2]
    starts = range(0, t, QUERY_TILE)
    for i0 in reversed(starts):  # the last query tile first: it sees every key, so it starts dk and dv
        i1, first = min(t, i0 + QUERY_TILE), i0 == starts[-1]
        keep = mask.tile(i0, i1)
        qi, gi, di, li = q[:, :, i0:i1], g[:, :, i0:i1], d[:, :, i0:i1], lse[:, :, i0:i1]
        for j0 in range(0, i1, span):
            j1 = min(i1, j0 + span)
            p = np.matmul(qi, kt[..., j0:j1])
            _scores_shift(jit, p, scale, i0, j0, li)
            np.exp(p, out=p)
            kj = None if keep is None else keep[..., j0:j1]
            pd = p if kj is None else _dropped(jit, p, kj, keep_scale, np.empty_like(p))
            _accumulate(pd.swapaxes(-1, -2), gi, dv[:, :, j0:j1], first)
            ds = np.matmul(gi, vt[..., j0:j1])
            _score_grad(jit, ds, p, kj, keep_scale, di, scale)
            _accumulate(ds, k[:, :, j0:j1], dq[:, :, i0:i1], j0 == 0)
            _accumulate(ds.swapaxes(-1, -2), qi, dk[:, :, j0:j1], first)


def _accumulate(a: np.ndarray, b: np.ndarray, out: np.ndarray, first: bool) -> None:
    """out = a @ b on the first contribution, out += a @ b after it."""
    if first:
        np.matmul(a, b, out=out)
    else:
        out += np.matmul(a, b)


# ---- groups of heads and their operands ------------------------------------------------------------

def _key_span(d: int) -> int:
    """Keys per product: the most that keep a tile's products within SMALL_PRODUCT multiply-adds, in whole
    query tiles (a span then starts at or before each of its queries: every row of a product sees a key)."""
    return QUERY_TILE * max(1, SMALL_PRODUCT // (QUERY_TILE * QUERY_TILE * d))


def _group_heads(t: int, d: int, cdt: np.dtype) -> int:
    """Heads per group: as many as keep a group's copy of its keys within GROUP_BYTES."""
    return max(1, GROUP_BYTES // (t * d * cdt.itemsize))


def _run_groups(fn, b: int, h: int, most: int, grain: int) -> None:
    """fn(group) for the [B, H] (batch, head) rows in groups of at most `most` heads, the rows shared among
    the rank's threads in contiguous ranges of at least `grain` (engine.fast.thread_pool.split). A group's
    arithmetic is the same on any thread and in any group, so the bits are too."""
    def share(lo: int, hi: int) -> None:
        for at in _groups(lo, hi, h, most):
            fn(at)
    thread_pool.split(share, b * h, grain)


def _groups(lo: int, hi: int, heads: int, most: int):
    """(rows, heads) slices covering the flat (batch, head) rows [lo, hi) in order, each a rectangle of at
    most `most` heads (at least one): whole batch rows together where they fit, else runs of a row's heads."""
    n = lo
    while n < hi:
        row, first = divmod(n, heads)
        whole = min((hi - n) // heads, most // heads) if first == 0 else 0
        if whole:
            yield slice(row, row + whole), slice(0, heads)
            n += whole * heads
        else:
            end = min(heads, first + hi - n, first + most)
            yield slice(row, row + 1), slice(first, end)
            n += end - first


def _operand(a: np.ndarray, cdt: np.dtype) -> np.ndarray:
    """a in the compute dtype: itself, strided as it is (a product's left operand), or its widened copy."""
    return a if a.dtype == cdt else lowp.widen(a)


def _contiguous(a: np.ndarray, cdt: np.dtype) -> np.ndarray:
    """a in the compute dtype, C-contiguous: a product's right operand whose long columns BLAS reads faster
    unstrided."""
    return np.ascontiguousarray(_operand(a, cdt))


def _transposed(jit, a: np.ndarray, cdt: np.dtype) -> np.ndarray:
    """[..., D, T] C-contiguous copy of a [..., T, D] in the compute dtype: the right operand of the tile
    products, which BLAS runs faster than a transposed view (one pass over a group's keys)."""
    a = _operand(a, cdt)
    if jit is None:
        return np.ascontiguousarray(a.swapaxes(-1, -2))
    out = np.empty((*a.shape[:-2], a.shape[-1], a.shape[-2]), cdt)
    jit.transposed(a, out)
    return out


class _Mask:
    """The dropout keep-mask of one group of heads, drawn a query tile at a time: the site's [B, H, T, T] mask
    (mask row = batch row; a head's [T, T] block follows the previous head's in it)."""

    def __init__(self, site: MaskSite | None, at: Group, t: int):
        self.site, self.t = site, t
        (self.r0, self.r1), (self.h0, self.h1) = ((s.start, s.stop) for s in at)

    def tile(self, i0: int, i1: int) -> np.ndarray | None:
        """Queries [i0, i1) against every key: [rows, heads, i1 - i0, T], or None without dropout."""
        site, t = self.site, self.t
        if site is None:
            return None
        shape = (self.r1 - self.r0, self.h1 - self.h0, i1 - i0, t)
        if i0 == 0 and i1 == t:  # whole heads: one run of each row's mask
            return site.block(self.r0, self.r1, self.h0 * t * t, self.h1 * t * t).reshape(shape)
        keep = np.empty(shape, bool)
        for r in range(self.r0, self.r1):
            for h in range(self.h0, self.h1):
                block = site.block(r, r + 1, (h * t + i0) * t, (h * t + i1) * t)
                keep[r - self.r0, h - self.h0] = block.reshape(i1 - i0, t)
        return keep


# ---- the per-tile elementwise work: compiled, or the NumPy chain with the same bits -----------------

def _flat(a: np.ndarray) -> np.ndarray:
    """A [rows, heads, ...] tile as [rows * heads, ...] (a view: the tiles are made per group, in order)."""
    return a.reshape(-1, *a.shape[2:])


def _above(s: np.ndarray, q_off: int, k_off: int) -> np.ndarray:
    """[queries, keys]: True where the key is after the query."""
    return np.arange(k_off, k_off + s.shape[-1]) > np.arange(q_off, q_off + s.shape[-2])[:, None]


def _scores_online(jit, s, scale, q_off, k_off, m, shift) -> None:
    if jit is not None:
        jit.scores_online(_flat(s), scale, q_off, k_off, _flat(m), _flat(shift), s.dtype.type(-np.inf))
        return
    s *= scale
    np.copyto(s, -np.inf, where=_above(s, q_off, k_off))
    top = np.maximum(m, s.max(-1))
    np.subtract(m, top, out=shift)
    m[...] = top
    s -= top[..., None]


def _scores_shift(jit, s, scale, q_off, k_off, lse) -> None:
    if jit is not None:
        jit.scores_shift(_flat(s), scale, q_off, k_off, _flat(lse), s.dtype.type(-np.inf))
        return
    s *= scale
    s -= lse[..., None]
    np.copyto(s, -np.inf, where=_above(s, q_off, k_off))


def _dropped(jit, p, keep, keep_scale, out) -> np.ndarray:
    if jit is not None:
        jit.dropped(_flat(p), _flat(keep), keep_scale, p.dtype.type(1), p.dtype.type(0), _flat(out))
        return out
    np.multiply(p, keep, out=out)
    out *= keep_scale
    return out


def _score_grad(jit, dp, p, keep, keep_scale, d, scale) -> None:
    one, zero = dp.dtype.type(1), dp.dtype.type(0)
    if jit is not None and keep is None:
        jit.score_grad(_flat(dp), _flat(p), _flat(d), scale)
    elif jit is not None:
        jit.dropped_score_grad(_flat(dp), _flat(p), _flat(keep), keep_scale, one, zero, _flat(d), scale)
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
    out, lse = np.empty_like(x), np.empty((1, 1, 3), np.float32)
    dq, dk, dv = (np.empty_like(x) for _ in range(3))
    forward(x, x, x, out, lse, None, np.float32(1), 1)
    backward(x, x, x, out, lse, x, dq, dk, dv, None, np.float32(1), 1)
