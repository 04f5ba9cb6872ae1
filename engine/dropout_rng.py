"""Dropout masks that depend on the global row, not on who computes it.

Every mask element is drawn from a counter-based generator (Philox) keyed by

    (seed, step, site, global row)

where `site` counts the dropout calls of one forward in order (the embedding's dropout is site 0,
block 0's attention dropout site 1, ...) and `global row` is the row's index in the step's global
batch. A row's mask is therefore the same whichever rank, micro-batch or contiguous run of rows it is
computed in: N ranks with dropout draw exactly the masks one process draws for the same global batch.

How: the counter words are [block, site, step, 0] and the key is [seed, DOMAIN]. Row r of a site owns
the blocks [r * B, (r + 1) * B) of its (seed, step, site) stream, B = the row's elements rounded up to a
whole block (one Philox block = four 64-bit words = eight 32-bit draws). A contiguous run of rows is one
generator and one draw; it starts at its first row's block, so it reads the same words as the rows
drawn one by one. An element is kept when its 32-bit draw is >= p * 2^32.

`keep_mask` draws a whole mask at once; `mask_site` takes the next site without drawing, for an op that
draws its mask piece by piece (the fused attention draws a query tile's part in forward and again in
backward, never holding the whole): `MaskSite.block` reads exactly the words `keep_mask` reads for the same
elements, so the pieces equal the corresponding slices of the whole mask.

The trainer calls `begin(step, first_row)` before each micro-batch's forward; activation checkpointing
saves `position()` before a block and `rewind`s to it for the recompute. Nothing is left to save in a
checkpoint: the step number restores the stream. Used standalone (no `begin`), the site counter keeps
counting, so successive forwards still draw fresh masks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

DOMAIN = 0x64726F706F7574  # "dropout": the key's second word, apart from any other use of the seed
_DRAWS_PER_BLOCK = 8  # 32-bit draws per Philox block (4 x uint64)


class DropoutRNG:
    """The model's dropout randomness: keep-masks keyed by (seed, step, site, global row)."""

    def __init__(self, seed: int = 0):
        self.seed = seed
        self.step = 0
        self.first_row = 0  # the global row of this forward's first row
        self.site = 0  # dropout calls so far in this forward

    def begin(self, step: int, first_row: int) -> None:
        """Before a forward over the global batch's rows [first_row, ...) of optimizer step `step`."""
        self.step, self.first_row, self.site = int(step), int(first_row), 0

    def position(self) -> tuple[int, int, int]:
        return self.step, self.first_row, self.site

    def rewind(self, position: tuple[int, int, int]) -> None:
        self.step, self.first_row, self.site = position

    def keep_mask(self, shape: tuple[int, ...], p: float) -> np.ndarray:
        """A boolean mask of `shape` (axis 0 = rows), True with probability 1 - p; the next site."""
        site = self.mask_site(shape, p)
        return site.block(0, site.rows, 0, site.per_row).reshape(shape)

    def mask_site(self, shape: tuple[int, ...], p: float) -> MaskSite:
        """The next site's mask of `shape`, to be drawn in pieces (`MaskSite.block`), as often as needed."""
        site, self.site = self.site, self.site + 1
        rows, per_row = (shape[0], math.prod(shape[1:])) if shape else (1, 1)
        return MaskSite(self.seed, self.step, self.first_row, site, rows, per_row,
                        np.uint32(min(round(p * 2.0**32), 2**32 - 1)))


class PartOfRNG(DropoutRNG):
    """A rank's part of every mask `base` draws for the whole tensor (subclasses say which part, in
    mask_site). Its own state is left unset on purpose: every draw and every site count is base's."""

    def __init__(self, base: DropoutRNG):
        self.base = base

    def begin(self, step: int, first_row: int) -> None:
        self.base.begin(step, first_row)

    def position(self) -> tuple[int, int, int]:
        return self.base.position()

    def rewind(self, position: tuple[int, int, int]) -> None:
        self.base.rewind(position)


@dataclass(frozen=True)
class MaskSite:
    """One site's keep-mask, [rows, per_row] elements (the mask's shape flattened after axis 0), undrawn."""

    seed: int
    step: int
    first_row: int
    site: int
    rows: int
    per_row: int
    threshold: np.uint32  # an element is kept when its draw is >= this

    def block(self, lo: int, hi: int, start: int, stop: int) -> np.ndarray:
        """mask[lo:hi, start:stop] of the mask flattened to [rows, per_row], as a new bool array.

        Row r's element e is draw e % 8 of block (first_row + r) * B + e // 8 of the stream (B = blocks per
        row). Whole rows are one contiguous run (one generator); a part of each row is one run per row."""
        blocks = -(-self.per_row // _DRAWS_PER_BLOCK)
        if start == 0 and stop == self.per_row:
            draws = blocks * _DRAWS_PER_BLOCK
            rows = self._draws((self.first_row + lo) * blocks, 0, (hi - lo) * draws)
            return rows.reshape(hi - lo, draws)[:, :stop]
        out = np.empty((hi - lo, stop - start), bool)
        skip = start % _DRAWS_PER_BLOCK
        for r in range(lo, hi):
            first_block = (self.first_row + r) * blocks + start // _DRAWS_PER_BLOCK
            out[r - lo] = self._draws(first_block, skip, stop - start)
        return out

    def _draws(self, first_block: int, skip: int, n: int) -> np.ndarray:
        """Keep flags of the n draws after the first `skip` of the stream from block `first_block` on."""
        blocks = -(-(skip + n) // _DRAWS_PER_BLOCK)
        bits = np.random.Philox(counter=[first_block, self.site, self.step, 0], key=[self.seed, DOMAIN])
        words = bits.random_raw(blocks * _DRAWS_PER_BLOCK // 2).view(np.uint32)
        return words[skip:skip + n] >= self.threshold
