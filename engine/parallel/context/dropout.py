"""Dropout under context parallelism: every rank draws exactly its positions' part of the masks one device
draws, so a context-parallel run drops what one device drops.

One device draws a site's mask over the whole tensor, keyed by (seed, step, site, global row)
(engine.dropout_rng): element e of a row is draw e of that row's stream, whoever asks for it. A
context-parallel rank holds some chunks of every sequence (layout.py), so its part of a mask is:

    token-wise dropout [B, s, ...]      (the embedding's, each block's two residual dropouts) the rows of
                                        its positions along axis 1: one run of every mask row per chunk it
                                        holds (ContextMaskRNG, PositionsSite)
    attention's probabilities [B, H, s, s]  per ring block, the one-device mask's [query rows of the block's
                                        query chunk, key columns of the visiting key chunk] (BlockSite): the
                                        ring asks for the whole [B, H, s, s] site once per forward (one site,
                                        as one device's attention takes), and each block draws its rectangle
                                        of it, in forward and again in backward, never the whole mask

Under tensor parallelism the one-device mask is first cut by heads (attention) or by the sequence (sequence
parallelism) by engine.parallel.tensor.dropout's ShardedMaskRNG; the plan stacks the two: a sequence-parallel
rank's slice of its context-parallel slice, a tensor-parallel rank's heads of the whole [B, H, s, s].

The attention block's probabilities P = exp(S - m) are dropped after their row sum l is taken, as the fused
attention does: O_blk = dropout(P) V / l, lse_blk = m + log l. The online-softmax merge is linear in the
blocks' numerators, so the merged output is dropout(softmax) V over all the keys, the one-device output. The
backward's row term D = rowsum(dO * O) holds through dropout (sum_j P_ij dP_ij with dP_ij = keep_ij dO_i v_j /
(1-p) is dO_i . O_i), so blocks.backward needs only the block's mask.

Drawing: a mask row's run of draws is one Philox generator from the run's first block. A block's query rows
are s apart in the one-device mask; when the gap between two rows is short (MERGE_GAP draws) drawing through
it costs less than starting a generator per row, so a head's rows are drawn as one span and the columns
picked out; otherwise one run per query row. Either way every element is its own draw: the bits are the same.
Cost: a block draws its query rows' span whole, so a rank draws each of its query chunks' rows once per
block it computes on them (zigzag, c = 2: 5 blocks of s/4 rows, 1.25 s^2 draws a head against one device's
s^2 for the whole sequence); the draws, not the products, are what dropout adds to a ring.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from engine.dropout_rng import DropoutRNG, MaskSite, PartOfRNG
from engine.parallel.context.layout import SequenceLayout
from engine.parallel.tensor.dropout import ShardedMaskRNG

# Draws skipped between a block's query rows, at most, to draw them as one span: about what starting a Philox
# generator costs (a few microseconds: some thousands of draws)
MERGE_GAP = 2048


@dataclass(frozen=True)
class PositionsSite(MaskSite):
    """A site's mask over this rank's tokens: `runs` (local start, start in `whole`, length) of every row,
    in the row's flattened elements, the local runs side by side."""

    whole: MaskSite | None = None
    runs: tuple[tuple[int, int, int], ...] = ()

    def block(self, lo: int, hi: int, start: int, stop: int) -> np.ndarray:
        assert self.whole is not None
        pieces = []
        for local, at, n in self.runs:
            a, b = max(start, local), min(stop, local + n)
            if a < b:
                pieces.append(self.whole.block(lo, hi, at + a - local, at + b - local))
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces, axis=1)


class ContextMaskRNG(PartOfRNG):
    """What `base` would draw for whole sequences, at this rank's positions along axis 1 (a token-wise
    mask [B, s/c, ...] is the one-device [B, s, ...] mask's rows of the rank's chunks). Counts its sites on
    base."""

    def __init__(self, base: DropoutRNG, layout: SequenceLayout, rank: int):
        super().__init__(base)
        self.layout, self.rank = layout, rank

    def mask_site(self, shape: tuple[int, ...], p: float) -> MaskSite:
        if len(shape) < 2:
            raise ValueError(f"a context-parallel dropout mask holds a sequence on axis 1; {shape} has none")
        seq = shape[1] * self.layout.degree
        whole = self.base.mask_site((shape[0], seq) + tuple(shape[2:]), p)
        inner, n = math.prod(shape[2:]), self.layout.chunk_length(seq)
        runs: list[tuple[int, int, int]] = []
        for i, chunk in enumerate(self.layout.chunks(self.rank)):
            local, at, length = i * n * inner, chunk * n * inner, n * inner
            if runs and runs[-1][1] + runs[-1][2] == at:  # adjacent chunks: one run
                runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + length)
            else:
                runs.append((local, at, length))
        return PositionsSite(whole.seed, whole.step, whole.first_row, whole.site, whole.rows,
                             math.prod(shape[1:]), whole.threshold, whole=whole, runs=tuple(runs))


@dataclass(frozen=True)
class BlockSite(MaskSite):
    """One ring block's part of an attention site: of `whole`'s [B, H, seq, seq] mask, the query rows
    [q0, q0 + nq) against the key columns [k0, k0 + nk) of every head: a [B, H, nq, nk] mask."""

    whole: MaskSite | None = None
    seq: int = 0
    q0: int = 0
    k0: int = 0
    nq: int = 0
    nk: int = 0

    def block(self, lo: int, hi: int, start: int, stop: int) -> np.ndarray:
        """Rows [lo, hi) of the local [B, H * nq * nk] mask, elements [start, stop): whole (head, query) rows
        (what the fused kernel's query tiles and the ring's blocks ask for)."""
        assert self.whole is not None
        nk, seq = self.nk, self.seq
        if start % nk or stop % nk:
            raise ValueError(f"ring block masks are drawn in whole query rows of {nk}: not [{start}, {stop})")
        out = np.empty((hi - lo, stop - start), bool)
        row, end, at = start // nk, stop // nk, 0
        while row < end:  # one head's run of query rows at a time
            head, i = divmod(row, self.nq)
            rows = min(self.nq - i, end - row)
            first = (head * seq + self.q0 + i) * seq + self.k0
            dst = out[:, at:at + rows * nk].reshape(hi - lo, rows, nk)
            if seq - nk <= MERGE_GAP:  # the rows as one span, the gaps drawn through
                span = np.ascontiguousarray(self.whole.block(lo, hi, first, first + (rows - 1) * seq + nk))
                step, item = span.strides
                dst[...] = as_strided(span, (hi - lo, rows, nk), (step, seq * item, item), writeable=False)
            else:
                for j in range(rows):
                    dst[:, j] = self.whole.block(lo, hi, first + j * seq, first + j * seq + nk)
            row, at = row + rows, at + rows * nk
        return out

    def mask(self) -> np.ndarray:
        """The whole block's mask [B, H, nq, nk]."""
        heads = self.per_row // (self.nq * self.nk)
        return self.block(0, self.rows, 0, self.per_row).reshape(self.rows, heads, self.nq, self.nk)


@dataclass(frozen=True)
class AttentionDropout:
    """A ring attention's dropout for one forward (and its backward): the site of the one-device [B, H, seq,
    seq] mask (H: this rank's heads under tensor parallelism), and the scale of a kept probability."""

    site: MaskSite
    keep_scale: Any  # 1 / (1 - p) rounded to the inputs' dtype, in the compute dtype (as the fused kernel's)
    seq: int

    def block(self, q_chunk: int, k_chunk: int, n: int) -> BlockSite:
        """The [B, H, n, n] mask of query chunk `q_chunk` against key chunk `k_chunk` (chunks of n tokens)."""
        s = self.site
        heads = s.per_row // (self.seq * self.seq)
        return BlockSite(s.seed, s.step, s.first_row, s.site, s.rows, heads * n * n, s.threshold, whole=s,
                         seq=self.seq, q0=q_chunk * n, k0=k_chunk * n, nq=n, nk=n)


def attention_dropout(rng: DropoutRNG | None, p: float, training: bool, shape: tuple[int, int, int],
                      dtype, compute) -> AttentionDropout | None:
    """The dropout of a ring attention over [B, H, seq] (whole sequences), or None when it drops nothing.
    Takes the rng's next site, as one device's attention does, only when it drops."""
    if not (training and p > 0.0):
        return None
    if rng is None:
        raise ValueError("ring attention with dropout in training needs an rng")
    b, h, seq = shape
    keep_scale = np.asarray(1.0 / (1.0 - p), dtype=dtype).astype(compute)[()]
    return AttentionDropout(rng.mask_site((b, h, seq, seq), p), keep_scale, seq)


def context_rng(rng: DropoutRNG, base: DropoutRNG, positions: ContextMaskRNG) -> DropoutRNG:
    """A token-wise dropout's rng, planned: `base` (the model's) becomes `positions`; a sequence-parallel
    slice of base's becomes the same slice of positions'; anything else stays."""
    if rng is base:
        return positions
    if isinstance(rng, ShardedMaskRNG) and rng.base is base:
        return ShardedMaskRNG(positions, rng.parts, rng.index)
    return rng
