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

The trainer calls `begin(step, first_row)` before each micro-batch's forward; activation checkpointing
saves `position()` before a block and `rewind`s to it for the recompute. Nothing is left to save in a
checkpoint: the step number restores the stream. Used standalone (no `begin`), the site counter keeps
counting, so successive forwards still draw fresh masks.
"""

from __future__ import annotations

import math

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
        site, self.site = self.site, self.site + 1
        rows, per_row = (shape[0], math.prod(shape[1:])) if shape else (1, 1)
        blocks = -(-per_row // _DRAWS_PER_BLOCK)
        draws = blocks * _DRAWS_PER_BLOCK
        bits = np.random.Philox(counter=[self.first_row * blocks, site, self.step, 0],
                                key=[self.seed, DOMAIN])
        words = bits.random_raw(rows * draws // 2).view(np.uint32).reshape(rows, draws)
        threshold = np.uint32(min(round(p * 2.0**32), 2**32 - 1))
        return (words[:, :per_row] >= threshold).reshape(shape)
