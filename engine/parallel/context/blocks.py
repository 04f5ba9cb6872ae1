"""One block of ring attention: a chunk of queries against a chunk of keys and values, forward and
backward, in NumPy, in the compute dtype (float64 stays float64; float32 for float32 and 16-bit inputs).

engine.fast.flash computes whole causal self-attention (queries and keys the same positions); a ring rank
needs blocks of its queries against another rank's keys, whole or causal on the diagonal, and the
block's log-sum-exp to merge with. A block is small (s/c or s/2c tokens a side), so it is computed as
one product, not in tiles. Operands should be C-contiguous per (batch, head) matrix (the ring makes them so):
NumPy hands those to BLAS; strided views of a QKV array can take its slow loop instead.

    forward   S = q k^T / sqrt(d) (diagonal: the upper triangle masked), m = rowmax S,
              P = exp(S - m), l = rowsum P;  O_blk = P v / l,  lse_blk = m + log l
    backward  with the merged output's lse and D = rowsum(dO * O) (the softmax's row term):
              P = exp(S - lse); dV = P^T dO; dS = P * (dO v^T - D); dQ = dS k / sqrt(d); dK = dS^T q / sqrt(d)
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np


@lru_cache(maxsize=8)
def _causal_bias(n: int, dtype: np.dtype) -> np.ndarray:
    """[n, n]: 0 on and below the diagonal, -inf above it (added to a diagonal block's scores: one pass)."""
    bias = np.triu(np.full((n, n), -np.inf, dtype), 1)
    bias.flags.writeable = False
    return bias


def _scores(q: np.ndarray, k: np.ndarray, diagonal: bool) -> np.ndarray:
    s = np.matmul(q, k.swapaxes(-1, -2))
    s *= q.dtype.type(1.0 / math.sqrt(q.shape[-1]))
    if diagonal:  # position i sees keys 0..i of the same chunk
        s += _causal_bias(s.shape[-1], s.dtype)
    return s


def forward(q: np.ndarray, k: np.ndarray, v: np.ndarray, diagonal: bool) -> tuple[np.ndarray, np.ndarray]:
    """(O_blk [..., Tq, D], lse_blk [..., Tq]) of q [..., Tq, D] against k, v [..., Tk, D]."""
    s = _scores(q, k, diagonal)
    m = s.max(-1, keepdims=True)
    np.subtract(s, m, out=s)
    np.exp(s, out=s)
    row_sum = s.sum(-1, keepdims=True)
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


def backward(q, k, v, g, rows, lse, diagonal: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dQ, dK, dV) of this block's share of the attention, given dO = g, D = rows and the merged lse."""
    p = _scores(q, k, diagonal)
    p -= lse[..., None]
    np.exp(p, out=p)
    dv = np.matmul(p.swapaxes(-1, -2), g)
    ds = np.matmul(g, v.swapaxes(-1, -2))
    ds -= rows[..., None]
    ds *= p
    ds *= q.dtype.type(1.0 / math.sqrt(q.shape[-1]))
    return np.matmul(ds, k), np.matmul(ds.swapaxes(-1, -2), q), dv
