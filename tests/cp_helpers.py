"""Shared by the context-parallel tests: whole-sequence softmax attention in plain NumPy (forward and its
backward, written from the formulas, independent of the engine's kernels), and a rank function that runs
ring attention on one rank's slice of a whole problem."""

from __future__ import annotations

import numpy as np

from engine.parallel.context.layout import SequenceLayout
from engine.parallel.context.ring_attention import Ring, ring_attention
from engine.tensor import Tensor


def full_attention(q, k, v, g, causal: bool, keep=None, p_drop: float = 0.0):
    """(out, dq, dk, dv) of softmax(q k^T / sqrt(d) [+ causal mask]) v over whole sequences [..., T, D],
    for dL/d out = g: the reference ring attention must equal. With `keep`, the probabilities are dropped by
    it and the kept ones scaled by 1 / (1 - p_drop)."""
    t, d = q.shape[-2], q.shape[-1]
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(d)
    if causal:
        s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    kept = 1.0 if keep is None else keep / (1.0 - p_drop)
    out = (p * kept) @ v
    dp = (g @ np.swapaxes(v, -1, -2)) * kept
    ds = p * (dp - (dp * p).sum(-1, keepdims=True)) / np.sqrt(d)
    return out, ds @ k, np.swapaxes(ds, -1, -2) @ q, np.swapaxes(p * kept, -1, -2) @ g


def problem(shape=(2, 3, 16, 8), seed=0, dtype=np.float64):
    """q, k, v and an output gradient g, [B, H, T, D]."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(dtype) for _ in range(4)]


def ring_rank(comm, emit, kind: str, causal: bool, arrays: list) -> dict:
    """Rank function: ring attention of this rank's slice of whole q, k, v (lists), backward with its slice
    of g; the output, gradients (this rank's positions) and the work counted."""
    layout = SequenceLayout(kind, comm.world_size)
    q, k, v, g = (layout.local(np.asarray(a), comm.rank, axis=2) for a in arrays)
    ring = Ring(comm, layout, causal)
    tq, tk, tv = (Tensor(a, requires_grad=True) for a in (q, k, v))
    out = ring_attention(tq, tk, tv, ring)
    out.backward(g)
    return {"out": out.data, "dq": tq.grad, "dk": tk.grad, "dv": tv.grad, "work": dict(ring.work),
            "positions": layout.positions(q.shape[2] * comm.world_size, comm.rank)}


def gather(ranks: list[dict], key: str, seq_len: int) -> np.ndarray:
    """The whole-sequence array of `key` put together from every rank's positions."""
    first = np.asarray(ranks[0][key])
    whole = np.zeros(first.shape[:2] + (seq_len,) + first.shape[3:], first.dtype)
    for r in ranks:
        whole[:, :, r["positions"]] = r[key]
    return whole
