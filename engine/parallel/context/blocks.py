"""One block of ring attention: a chunk of queries against a chunk of keys and values, forward and
backward, in the compute dtype (float64 stays float64; float32 for float32 and 16-bit inputs).

A ring rank needs blocks of its queries against another rank's keys, and each block's log-sum-exp to merge
with. A diagonal block (a chunk against its own keys) is causal self-attention of the chunk: engine.fast.flash
computes it, its products only up to the diagonal. A whole block (an earlier chunk's keys, or any block
without a causal mask) has no mask, which the fused kernel does not offer: it is computed here in NumPy, as
one product (a block is s/c or s/2c tokens a side), not in tiles. Operands should be C-contiguous per
(batch, head) matrix (the ring makes them so): NumPy hands those to BLAS; strided views of a QKV array can
take its slow loop instead.

    forward   S = q k^T / sqrt(d), m = rowmax S, P = exp(S - m), l = rowsum P;  O_blk = P v / l,
              lse_blk = m + log l
    backward  with the merged output's lse and D = rowsum(dO * O) (the softmax's row term):
              P = exp(S - lse); dV = P^T dO; dS = P * (dO v^T - D); dQ = dS k / sqrt(d); dK = dS^T q / sqrt(d)

With dropout (`drop`: the block's part of the one-device mask, engine.parallel.context.dropout) the kept
probabilities are scaled by `keep_scale` after the row sum is taken, as the fused kernel does:
O_blk = (P * keep * keep_scale) v / l; backward dV = (P * keep * keep_scale)^T dO and
dS = P * (keep * keep_scale * dO v^T - D). A diagonal block hands its mask to the fused kernel, which draws
it a query tile at a time.
"""

from __future__ import annotations

import math

import numpy as np

from engine.fast import flash
from engine.parallel.context.dropout import BlockSite


def _scores(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    s = np.matmul(q, k.swapaxes(-1, -2))
    s *= q.dtype.type(1.0 / math.sqrt(q.shape[-1]))
    return s


def forward(q: np.ndarray, k: np.ndarray, v: np.ndarray, diagonal: bool, drop: BlockSite | None = None,
            keep_scale=1.0) -> tuple[np.ndarray, np.ndarray]:
    """(O_blk [B, H, Tq, D], lse_blk [B, H, Tq]) of q [B, H, Tq, D] against k, v [B, H, Tk, D]."""
    if diagonal:  # causal self-attention of the chunk: the fused kernel's job, at half the products
        out, lse = np.empty(q.shape[:-1] + v.shape[-1:], q.dtype), np.empty(q.shape[:-1], q.dtype)
        flash.forward(q, k, v, out, lse, drop, _scale(q, drop, keep_scale), q.shape[0] * q.shape[1])
        return out, lse
    s = _scores(q, k)
    m = s.max(-1, keepdims=True)
    np.subtract(s, m, out=s)
    np.exp(s, out=s)
    row_sum = s.sum(-1, keepdims=True)
    if drop is not None:  # dropped after the row sum: the normaliser is the undropped one
        s *= drop.mask()
        s *= q.dtype.type(keep_scale)
    out = np.matmul(s, v)
    out /= row_sum
    return out, (m + np.log(row_sum))[..., 0]


def merge(out: np.ndarray, lse: np.ndarray, out_blk: np.ndarray, lse_blk: np.ndarray) -> None:
    """Fold a block's (O_blk, lse_blk) into the running (out, lse), in place: the softmax over the union of
    their keys. Stable: every exponent is <= 0 (lse starts at -inf, out at 0)."""
    new = np.logaddexp(lse, lse_blk)
    out *= np.exp(lse - new)[..., None]
    out += np.exp(lse_blk - new)[..., None] * out_blk
    lse[...] = new


def backward(q, k, v, g, rows, lse, diagonal: bool, out=None, drop: BlockSite | None = None,
             keep_scale=1.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dQ, dK, dV) of this block's share of the attention, given dO = g, D = rows and the merged lse (a
    diagonal block: the merged output `out`, from which the fused kernel takes D itself); `drop` and
    `keep_scale` as forward's."""
    if diagonal:
        dq, dk, dv = (np.empty(a.shape, q.dtype) for a in (q, k, v))
        flash.backward(q, k, v, out, lse, g, dq, dk, dv, drop, _scale(q, drop, keep_scale),
                       q.shape[0] * q.shape[1])
        return dq, dk, dv
    p = _scores(q, k)
    p -= lse[..., None]
    np.exp(p, out=p)
    ds = np.matmul(g, v.swapaxes(-1, -2))
    if drop is not None:
        kept = drop.mask() * q.dtype.type(keep_scale)  # keep / (1 - p), in the compute dtype
        dv = np.matmul((p * kept).swapaxes(-1, -2), g)
        ds *= kept
    else:
        dv = np.matmul(p.swapaxes(-1, -2), g)
    ds -= rows[..., None]
    ds *= p
    ds *= q.dtype.type(1.0 / math.sqrt(q.shape[-1]))
    return np.matmul(ds, k), np.matmul(ds.swapaxes(-1, -2), q), dv


def _scale(q: np.ndarray, drop: BlockSite | None, keep_scale):
    """The fused kernel's keep scale: 1 without dropout, else `keep_scale` in the compute dtype."""
    return q.dtype.type(1 if drop is None else keep_scale)
