"""A replica's pieces seen through the model's tensor-parallel layout (engine.parallel.tensor).

Under tensor parallelism a data-parallel replica holds one tensor-parallel rank's model: some parameters
are shards (their squares differ across the TP group), the others replicas of one another, and under
sequence parallelism some replicated ones carry partial gradients (each TP rank saw s/t of the tokens).
The replica's gradients live in flat pieces, not in p.grad (ZeRO drops p.grad), so this finds, in each
piece, the element ranges of each kind from the parameter names, and does per piece what the layout says:

  * sum_partial_grads   the partial gradients summed over the TP group: one all-reduce per step, after
                        the data-parallel reduce (both are sums, so the order does not change the result),
                        of one buffer laid out as every partial parameter whole, whatever this rank owns
                        (its pieces' parts filled in, zeros elsewhere): the same buffer and the same bytes
                        on every rank at any ZeRO stage, as the estimator and the projection count it
  * sums_of_squares     (sharded, replicated) sums of squares, for the gradient norm: the layout adds the
                        sharded part over the TP group and counts the replicated part once

The TP ranks of one data-parallel position hold equal shapes, so their pieces have the same ranges. For a
model that is not tensor-parallel (whole.WholeModel) nothing is sharded or partial: one sum per piece, as
before the split existed.
"""

from __future__ import annotations

import numpy as np

from engine.optim import sum_of_squares


def _overlaps(piece, chosen) -> list:
    """(lo, hi, slot): the piece's overlap (its own coordinates) with each parameter `chosen` accepts."""
    lo, hi = piece.offset, piece.offset + piece.param.size
    return [(max(lo, s.start) - lo, min(hi, s.end) - lo, s) for s in piece.flat.slots
            if max(lo, s.start) < min(hi, s.end) and chosen(s.name)]


def _ranges(piece, chosen) -> list[tuple[int, int]]:
    """[lo, hi) ranges of the piece (its own coordinates) covered by parameters `chosen(name)` accepts,
    adjacent ones joined."""
    out: list[tuple[int, int]] = []
    for a, b, _ in _overlaps(piece, chosen):
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def _complement(ranges: list[tuple[int, int]], size: int) -> list[tuple[int, int]]:
    out, at = [], 0
    for a, b in ranges:
        if a > at:
            out.append((at, a))
        at = b
    return out + ([(at, size)] if at < size else [])


class TensorSplit:
    """The pieces' sharded and partial ranges under `layout` (a TensorParallelLayout or a WholeModel)."""

    def __init__(self, pieces, layout, ledger):
        self.pieces, self.layout, self.ledger = pieces, layout, ledger
        self.sharded = [_ranges(p, layout.is_sharded) for p in pieces]
        self.replicated = [_complement(r, p.param.size) for r, p in zip(self.sharded, pieces)]
        # where each piece's partial ranges go in the buffer: every partial parameter whole, in layout order
        at, self.partial_numel = {}, 0
        for piece in pieces:
            for slot in piece.flat.slots:
                if slot.name not in at and layout.sums_partial(slot.name):
                    at[slot.name] = self.partial_numel - slot.start  # + a flat position = buffer position
                    self.partial_numel += slot.end - slot.start
        self.partial = [[(a, b, at[slot.name] + piece.offset + a)
                         for a, b, slot in _overlaps(piece, layout.sums_partial)] for piece in pieces]

    def sum_partial_grads(self) -> None:
        """Sum the partial gradients of every piece over the TP group, through one buffer (counted as a
        communication buffer while it lives); nothing when there are none."""
        if not self.partial_numel:
            return
        buf = np.zeros(self.partial_numel, self.pieces[0].grad.dtype)
        with self.ledger.transient("comm_buffers", buf.nbytes):
            for piece, ranges in zip(self.pieces, self.partial):
                for a, b, at in ranges:
                    buf[at:at + b - a] = piece.grad[a:b]
            self.layout.sum_partial_grads(buf)
            for piece, ranges in zip(self.pieces, self.partial):
                for a, b, at in ranges:
                    piece.grad[a:b] = buf[at:at + b - a]

    def sums_of_squares(self, wide: np.ndarray) -> tuple[float, float]:
        """(sharded, replicated) sums of squares of this rank's pieces, through the float64 buffer `wide`."""
        sharded = replicated = 0.0
        for piece, shards, replicas in zip(self.pieces, self.sharded, self.replicated):
            if not shards:  # the whole piece at once: a whole model's sum, as it always was
                replicated += sum_of_squares(piece.grad, buf=wide)
                continue
            sharded += sum(sum_of_squares(piece.grad[a:b], buf=wide) for a, b in shards)
            replicated += sum(sum_of_squares(piece.grad[a:b], buf=wide) for a, b in replicas)
        return sharded, replicated
