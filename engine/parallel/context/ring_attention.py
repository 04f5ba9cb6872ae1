"""Ring attention: self-attention over sequences that c ranks hold a slice each of (layout.py), written
over point-to-point messages around the context-parallel group.

Forward, on every rank at once (c ranks, rank r; `next` = r+1, `prev` = r-1, mod c):

    kv = this rank's keys and values                     (the one copy that travels)
    for hop in 0 .. c-1:                                 kv now holds rank (r - hop)'s chunks
        hop < c-1: post kv's hop (send to next, receive prev's into a second buffer: hops.py's thread)
        for each of my query chunks x each of kv's key chunks:
            skip it (causal, key chunk later), or compute the block (blocks.py) and merge it into
            (out, lse) with the online softmax: lse' = logaddexp(lse, lse_blk), out rescaled to it
        hop < c-1: wait for the hop; the received pair is the next kv

So a hop moves while the blocks of the chunk before it are computed: it costs max(its transfer, those blocks),
not their sum.

Backward passes the keys and values around again (they were not kept: forward keeps only this rank's q, k,
v, its output and lse, as flash attention does), each with an accumulator of its owner's dK and dV that
every rank adds its queries' share to; after the c-th hop the accumulator is home:

    for hop in 0 .. c-1:                                 kv: rank (r - hop)'s
        hop < c-1: post kv's hop
        each block: dQ_mine += ..., its (dK, dV) held
        wait for the accumulator of kv's owner (hop 0: this rank's own, zeros), add the held (dK, dV) to it
        in the blocks' order, and post its hop (c > 1) to the next rank; wait for kv's hop
    wait for the last accumulator hop: this rank's own dK, dV, home

The accumulator of one hop travels during the next hop's blocks, the keys and values ahead of them; only the
accumulator's last hop home has no blocks beside it. Every sum is taken in the order the blocks come, as
when each block added at once, so the results do not depend on when the messages move (the held block
gradients of a hop are temporaries the ledger does not count, like the blocks' scores).

Traffic per hop, booked by the meter under the context-parallel group: forward "cp-fwd-kv" (K and V of
b·s/c tokens: 2·b·(s/c)·h elements), backward "cp-bwd-kv" (the same) and "cp-bwd-kv-grad" (dK, dV in the
compute dtype); c-1 forward hops, c-1 + c backward.

Precision: blocks are computed and merged in the compute dtype (float32 for 16-bit inputs; K and V travel
in their own dtype, dK and dV in the compute dtype), rounded once at the end, as the fused attention does.
Dropout (`dropout`, engine.parallel.context.dropout): one site of the one-device [B, H, s, s] mask per
forward, each block drawing its rectangle of it (its query chunk's rows, the visiting key chunk's columns),
in forward and again in backward; the probabilities are dropped after the block's row sum, so the merge is
unchanged.

Memory: the travelling K, V (and backward dK, dV) count as communication buffers in the rank's ledger, the
received ones too from a hop's post to its wait (engine.memory.context predicts them). Work: `Ring.work`
counts the blocks computed forward and their scores (layout.py says what each rank should compute).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from engine.comm.base import Communicator
from engine.dropout_rng import DropoutRNG
from engine.dtypes import compute_dtype
from engine.fast import lowp
from engine.memory.ledger import rank_ledger
from engine.parallel.context import blocks
from engine.parallel.context.dropout import AttentionDropout, BlockSite, attention_dropout
from engine.parallel.context.hops import Hops
from engine.parallel.context.layout import SequenceLayout, block_kind
from engine.tensor import Tensor, make

PHASES = {"forward": "cp-fwd-kv", "backward": "cp-bwd-kv", "grad": "cp-bwd-kv-grad"}


class Block(NamedTuple):
    """One block a rank computes: its query rows, the key rows of the chunk it holds, whether causal inside
    (diagonal), and the two chunks' indices in the whole sequence."""
    rows: slice
    cols: slice
    diagonal: bool
    q_chunk: int
    k_chunk: int


@dataclass
class Ring:
    """A context-parallel group, how it holds the sequence, and what its attention computed: `work`
    counts the blocks this rank computed forward ("blocks") and their scores ("scores", a diagonal
    block's whole square), summed over calls until cleared."""
    group: Communicator
    layout: SequenceLayout
    causal: bool = True
    work: Counter = field(default_factory=Counter)

    def __post_init__(self) -> None:
        if self.group.world_size != self.layout.degree:
            raise ValueError(f"a {self.layout.degree}-way layout on a group of {self.group.world_size}")

    def plan(self, seq_len: int, src: int) -> list[Block]:
        """Every block this rank computes against src's keys, for a local sequence of `seq_len` tokens."""
        mine, theirs = self.layout.chunks(self.group.rank), self.layout.chunks(src)
        n = seq_len // len(mine)
        out = []
        for i, a in enumerate(mine):
            for j, b in enumerate(theirs):
                kind = block_kind(a, b, self.causal)
                if kind is not None:
                    rows, cols = slice(i * n, (i + 1) * n), slice(j * n, (j + 1) * n)
                    out.append(Block(rows, cols, kind == "diagonal", a, b))
        return out


def _pair(k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """[2, B, H, T, D]: keys and values side by side in one C-contiguous array, what travels the ring."""
    kv = np.empty((2, *k.shape), k.dtype)
    kv[0], kv[1] = k, v
    return kv


def _dropped(dropout: AttentionDropout | None, blk: Block) -> tuple[BlockSite | None, Any]:
    """(the block's part of the dropout mask, the keep scale): (None, 1) without dropout."""
    if dropout is None:
        return None, 1.0
    return dropout.block(blk.q_chunk, blk.k_chunk, blk.rows.stop - blk.rows.start), dropout.keep_scale


def ring_forward(ring: Ring, q: np.ndarray, k: np.ndarray, v: np.ndarray, count: bool = True,
                 dropout: AttentionDropout | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(out, lse) in the compute dtype of q, k, v [B, H, T_local, D] (views of any strides); `count`: add the
    blocks computed to ring.work; `dropout`: the one-device mask's site, each block its part of it."""
    cdt, c, r = compute_dtype(q.dtype), ring.group.world_size, ring.group.rank
    qc, kv = np.ascontiguousarray(lowp.widen(q)), _pair(k, v)
    out = np.zeros(q.shape[:-1] + v.shape[-1:], cdt)
    lse = np.full(q.shape[:-1], -np.inf, cdt)
    with rank_ledger().transient("comm_buffers", kv.nbytes), Hops(ring.group) as hops:  # the pair in hand
        for hop in range(c):
            # the next pair moves while this one is computed on
            ahead = hops.post([kv], [PHASES["forward"]]) if hop < c - 1 else None
            kc, vc = lowp.widen(kv[0]), lowp.widen(kv[1])
            for blk in ring.plan(q.shape[2], (r - hop) % c):
                rows, cols = blk.rows, blk.cols
                o_blk, lse_blk = blocks.forward(qc[:, :, rows], kc[:, :, cols], vc[:, :, cols], blk.diagonal,
                                                *_dropped(dropout, blk))
                blocks.merge(out[:, :, rows], lse[:, :, rows], o_blk, lse_blk)
                if count:
                    ring.work["blocks"] += 1
                    ring.work["scores"] += int(np.prod(lse_blk.shape)) * (cols.stop - cols.start)
            if ahead is not None:
                kv = ahead.wait()[0]
    return out, lse


def ring_backward(ring: Ring, q, k, v, out, lse, g, dropout: AttentionDropout | None = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dQ, dK, dV) of this rank's q, k, v in the compute dtype, given dL/d out = g and forward's out, lse
    (and forward's `dropout`)."""
    cdt, c, r = compute_dtype(q.dtype), ring.group.world_size, ring.group.rank
    qc, gc = np.ascontiguousarray(lowp.widen(q)), np.ascontiguousarray(lowp.widen(g))
    oc = lowp.widen(out)
    rows_d = np.einsum("...i,...i->...", gc, oc)
    dq = np.zeros(q.shape, cdt)
    kv, dkv = _pair(k, v), np.zeros((2, *k.shape), cdt)
    with rank_ledger().transient("comm_buffers", kv.nbytes + dkv.nbytes), Hops(ring.group) as hops:
        back = None  # the accumulator's hop in flight: it brings the one of the keys computed next
        for hop in range(c):
            ahead = hops.post([kv], [PHASES["backward"]]) if hop < c - 1 else None
            kc, vc = lowp.widen(kv[0]), lowp.widen(kv[1])
            held = []  # the blocks' dK, dV, until their accumulator has arrived
            for blk in ring.plan(q.shape[2], (r - hop) % c):
                at, cols = (slice(None), slice(None), blk.rows), blk.cols
                dq_blk, dk_blk, dv_blk = blocks.backward(qc[at], kc[:, :, cols], vc[:, :, cols], gc[at],
                                                         rows_d[at], lse[at], blk.diagonal, oc[at],
                                                         *_dropped(dropout, blk))
                dq[at] += dq_blk
                held.append((cols, dk_blk, dv_blk))
            if back is not None:
                dkv = back.wait()[0]
            for cols, dk_blk, dv_blk in held:  # in the blocks' order: the sums of adding each at once
                dkv[0][:, :, cols] += dk_blk
                dkv[1][:, :, cols] += dv_blk
            if c > 1:  # on to the next rank; after the last block it goes home, to its owner
                back = hops.post([dkv], [PHASES["grad"]])
            if ahead is not None:
                kv = ahead.wait()[0]
        if back is not None:
            dkv = back.wait()[0]
    return dq, dkv[0], dkv[1]


def ring_attention(q: Tensor, k: Tensor, v: Tensor, ring: Ring) -> Tensor:
    """Attention of this rank's q, k, v [B, H, T_local, D] over the whole sequences the ring holds (causal
    or not, as `ring` says); output [B, H, T_local, D] in q's dtype. Keeps q, k, v, the output and lse."""
    qd, kd, vd = q.data, k.data, v.data
    out_c, lse = ring_forward(ring, qd, kd, vd)
    out = lowp.narrow(out_c, qd.dtype)

    def backward(g):
        grads = ring_backward(ring, qd, kd, vd, out, lse, g)
        return tuple(lowp.narrow(d, qd.dtype) for d in grads)
    return make(out, (q, k, v), backward, (qd, kd, vd, out, lse))


def _heads(a: np.ndarray, parts: int, n_head: int) -> np.ndarray:
    """[parts, B, n_head, T, D] view of a C-contiguous [B, T, parts * n_head * D] (the QKV layout)."""
    b, t, width = a.shape
    return a.reshape(b, t, parts, n_head, width // (parts * n_head)).transpose(2, 0, 3, 1, 4)


def ring_attention_qkv(qkv: Tensor, n_head: int, ring: Ring, count: bool = True, dropout_p: float = 0.0,
                       rng: DropoutRNG | None = None, training: bool = False) -> Tensor:
    """Ring attention on a QKV projection's output [B, T_local, 3C] -> [B, T_local, C], heads side by side:
    what a context-parallel block's attention calls in place of engine.ops.causal_attention_qkv, keeping
    the same arrays (qkv, the output, the lse); `count` as ring_forward's. With dropout in training, `rng`'s
    next site is the one-device [B, n_head, T, T] mask (T = T_local x the ring's degree) each block draws
    its part of."""
    b, t, width = qkv.shape
    if width % (3 * n_head):
        raise ValueError(f"ring_attention_qkv: a last axis of {width} is not 3 x {n_head} heads")
    x = np.ascontiguousarray(qkv.data)
    q, k, v = _heads(x, 3, n_head)
    drop = attention_dropout(rng, dropout_p, training, (b, n_head, t * ring.group.world_size), x.dtype,
                             compute_dtype(x.dtype))
    out_c, lse = ring_forward(ring, q, k, v, count, drop)
    out = np.empty((b, t, width // 3), x.dtype)
    _heads(out, 1, n_head)[0][...] = lowp.narrow(out_c, x.dtype)

    def backward(g):
        grad = np.empty(x.shape, x.dtype)
        o4, g4 = _heads(out, 1, n_head)[0], _heads(np.ascontiguousarray(g), 1, n_head)[0]
        for dst, d in zip(_heads(grad, 3, n_head), ring_backward(ring, q, k, v, o4, lse, g4, drop)):
            dst[...] = lowp.narrow(d, x.dtype)
        return (grad,)
    return make(out, (qkv,), backward, (x, out, lse))
