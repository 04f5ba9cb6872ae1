"""Ring attention by hand: c ranks simulated as lists in one process, in plain NumPy, forward and backward.

The readable start before ring_attention.py (which runs the same algorithm over a real communicator, in
blocks of chunks, in any precision). Rank r holds the queries, keys and values of some positions of the
sequence (`pos[r]`, any layout); one "hop" is every rank handing what it holds to the next rank of the
ring, written here as a rotation of the list. A rank never sees the whole sequence's keys at once: it
attends to one rank's keys at a time and folds each partial result into its own with the online softmax,

    lse = log sum_j exp(s_j)  over the keys seen so far;  a new block's (out_blk, lse_blk) merges as
    lse' = logaddexp(lse, lse_blk),  out' = exp(lse - lse') out + exp(lse_blk - lse') out_blk

which is exactly softmax attention over the union of the keys, in any order of the blocks. Backward sends
the keys and values around again with a gradient accumulator for their owner; after c hops every
accumulator is back home.
"""

from __future__ import annotations

import numpy as np


def split(x: np.ndarray, pos: list[np.ndarray]) -> list[np.ndarray]:
    """Each rank's rows of x [..., T, D] (rank r: positions pos[r])."""
    return [x[..., p, :] for p in pos]


def _scores(q, k, q_pos, k_pos, causal):
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    visible = (q_pos[:, None] >= k_pos[None, :]) if causal else np.ones((len(q_pos), len(k_pos)), bool)
    return np.where(visible, s, -np.inf)


def attend(q, k, v, q_pos, k_pos, causal):
    """One block: (out_blk, lse_blk) of q against k, v; a row that sees no key gets out 0, lse -inf."""
    s = _scores(q, k, q_pos, k_pos, causal)
    m = s.max(-1)
    m = np.where(np.isfinite(m), m, 0.0)        # a row with no visible key: any finite shift will do
    p = np.exp(s - m[..., None])                 # masked scores: exp(-inf) = 0
    total = p.sum(-1)
    with np.errstate(divide="ignore"):
        lse = m + np.log(total)                  # log 0 = -inf for a row that saw nothing
    return p @ v / np.where(total > 0, total, 1.0)[..., None], lse


def merge(out, lse, out_blk, lse_blk):
    """The online-softmax merge of two partial results over disjoint keys."""
    new = np.logaddexp(lse, lse_blk)
    safe = np.where(np.isfinite(new), new, 0.0)  # both -inf: nothing seen yet, weights 0
    return np.exp(lse - safe)[..., None] * out + np.exp(lse_blk - safe)[..., None] * out_blk, new


def ring_forward(qs, ks, vs, pos, causal=True):
    """Every rank's (out, lse): c hops of keys and values around the ring."""
    c = len(qs)
    out = [np.zeros(q.shape[:-1] + v.shape[-1:]) for q, v in zip(qs, vs)]
    lse = [np.full(q.shape[:-1], -np.inf) for q in qs]
    held = [(ks[r], vs[r], pos[r]) for r in range(c)]      # what rank r holds now
    for hop in range(c):
        for r in range(c):
            k, v, k_pos = held[r]
            out_blk, lse_blk = attend(qs[r], k, v, pos[r], k_pos, causal)
            out[r], lse[r] = merge(out[r], lse[r], out_blk, lse_blk)
        if hop < c - 1:
            held = [held[(r - 1) % c] for r in range(c)]    # each rank passes to the next: c-1 hops
    return out, lse


def ring_backward(qs, ks, vs, pos, out, lse, grads, causal=True):
    """Every rank's (dq, dk, dv) given dL/d out[r] = grads[r], from forward's out and lse."""
    c = len(qs)
    dq = [np.zeros_like(q) for q in qs]
    # keys, values, positions and the gradient accumulator of their owner travel together
    held = [(ks[r], vs[r], pos[r], np.zeros_like(ks[r]), np.zeros_like(vs[r])) for r in range(c)]
    for _hop in range(c):
        for r in range(c):
            k, v, k_pos, dk, dv = held[r]
            q, g = qs[r], grads[r]
            p = np.exp(_scores(q, k, pos[r], k_pos, causal) - lse[r][..., None])  # this block's softmax
            row = (g * out[r]).sum(-1, keepdims=True)       # sum_j dP_ij P_ij = dO_i . O_i
            ds = p * (g @ np.swapaxes(v, -1, -2) - row) / np.sqrt(q.shape[-1])
            dq[r] += ds @ k
            dk += np.swapaxes(ds, -1, -2) @ q
            dv += np.swapaxes(p, -1, -2) @ g
        held = [held[(r - 1) % c] for r in range(c)]
    # after c hops each accumulator is back with its owner
    return dq, [h[3] for h in held], [h[4] for h in held]
