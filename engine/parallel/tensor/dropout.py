"""Dropout under tensor and sequence parallelism: each rank draws its own part of the mask one device draws.

One device draws a site's mask over the whole tensor, keyed by (seed, step, site, global row)
(engine.dropout_rng). Under tensor parallelism a rank holds 1/t of the tensor along axis 1: attention's
heads [b, a, s, s] are split by heads, sequence-parallel activations [b, s, h] by the sequence, a
tensor-parallel MLP's hidden layer [b, 4h] by features. In each case rank r's part is block r of t along
axis 1, which in the mask flattened to [rows, per_row] is one contiguous run of every row. ShardedMaskRNG
hands out exactly that run of the one-device mask, so a tensor-parallel run drops what one device drops.

It counts sites on the model's own DropoutRNG (it draws nothing of its own), so a model may mix whole and
sharded dropouts, and the trainer's `begin` and the recompute's `rewind` keep working on `model.rng`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from engine import ops
from engine.comm.base import Communicator
from engine.dropout_rng import DropoutRNG, MaskSite, PartOfRNG
from engine.nn import Module
from engine.parallel.tensor.mappings import scatter_sequence
from engine.tensor import Tensor


@dataclass(frozen=True)
class MaskSiteSlice(MaskSite):
    """Columns [offset, offset + per_row) of every row of `whole`, a site's one-device mask."""

    whole: MaskSite | None = None
    offset: int = 0

    def block(self, lo: int, hi: int, start: int, stop: int) -> np.ndarray:
        assert self.whole is not None
        return self.whole.block(lo, hi, self.offset + start, self.offset + stop)


class ShardedMaskRNG(PartOfRNG):
    """The part `index` of `parts` along axis 1 of every mask `base` would draw for the whole tensor."""

    def __init__(self, base: DropoutRNG, parts: int, index: int):
        super().__init__(base)
        self.parts, self.index = parts, index

    def mask_site(self, shape: tuple[int, ...], p: float) -> MaskSite:
        if len(shape) < 2:
            raise ValueError(f"a sharded dropout mask splits axis 1; shape {shape} has none")
        whole = self.base.mask_site((shape[0], shape[1] * self.parts) + tuple(shape[2:]), p)
        per_row = math.prod(shape[1:])
        return MaskSiteSlice(whole.seed, whole.step, whole.first_row, whole.site, whole.rows, per_row,
                             whole.threshold, whole=whole, offset=self.index * per_row)


class SequenceShardDropout(Module):
    """The embedding's dropout under sequence parallelism: keep this rank's slice of the sequence, then drop
    with its slice of the one-device mask."""

    def __init__(self, p: float, rng: DropoutRNG, group: Communicator):
        super().__init__()
        self.p, self.group = p, group
        self.rng: DropoutRNG = rng

    def forward(self, x: Tensor) -> Tensor:
        return ops.dropout(scatter_sequence(x, self.group), self.p, self.rng, self.training)
