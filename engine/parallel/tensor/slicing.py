"""How a dense weight is cut among the t ranks of a tensor-parallel group, and put back together.

A ShardSpec names the axis a parameter is split along and how:

    axis 0   output features (column-parallel), vocabulary rows (vocab-parallel): W[out, in] by rows
    axis 1   input features (row-parallel): W[out, in] by columns

The axis is `sections` equal blocks, each split t ways on its own. The fused QKV weight [3C, C] is three
blocks (q, k, v), so rank r holds part r of each: whole heads of q, k and v, the heads its attention
computes. Split contiguously instead, rank 0 would hold all of q and part of k. Each block is padded with
zero rows up to a multiple of t first (only a vocabulary that t does not divide needs it): every rank
then holds the same shape, and the padding is masked where it could matter (the loss's logits).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ShardSpec:
    axis: int      # the axis split t ways
    length: int    # the dense length of that axis
    parts: int     # t
    sections: int = 1

    def __post_init__(self):
        if self.length % self.sections:
            raise ValueError(f"an axis of {self.length} does not cut into {self.sections} equal sections")

    @property
    def section(self) -> int:
        """Dense length of one section."""
        return self.length // self.sections

    @property
    def local_section(self) -> int:
        """Length of one rank's part of a section, padding included: ceil(section / t)."""
        return -(-self.section // self.parts)

    def local_shape(self, dense_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape every rank's shard of a `dense_shape` array has (padding included)."""
        shape = list(dense_shape)
        shape[self.axis] = self.sections * self.local_section
        return tuple(shape)

    def bounds(self, rank: int) -> tuple[int, int]:
        """Rank's part [lo, hi) of each section, in the section's dense coordinates (no padding)."""
        lo = min(rank * self.local_section, self.section)
        return lo, min(lo + self.local_section, self.section)

    def shard(self, dense: np.ndarray, rank: int) -> np.ndarray:
        """Rank's shard of `dense`: its part of every section, each zero-padded to local_section."""
        rows = np.moveaxis(dense, self.axis, 0)
        lo, hi = self.bounds(rank)
        out = np.zeros((self.sections * self.local_section,) + rows.shape[1:], dense.dtype)
        for s in range(self.sections):
            start = s * self.section
            out[s * self.local_section:s * self.local_section + hi - lo] = rows[start + lo:start + hi]
        return np.ascontiguousarray(np.moveaxis(out, 0, self.axis))

    def unshard(self, shards: list[np.ndarray]) -> np.ndarray:
        """The dense array from every rank's shard (rank order): the inverse of `shard`."""
        pieces = []
        for s in range(self.sections):
            part = slice(s * self.local_section, (s + 1) * self.local_section)
            joined = np.concatenate([np.moveaxis(a, self.axis, 0)[part] for a in shards])
            pieces.append(joined[:self.section])  # the padding at the end of the section
        return np.ascontiguousarray(np.moveaxis(np.concatenate(pieces), 0, self.axis))
