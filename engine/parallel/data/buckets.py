"""Gradient buckets whose lengths are multiples of the world size, so each splits into N equal parts.

Why aligned buckets: a bucket's reduce-scatter (engine.comm.collectives) leaves rank r with part r of
the bucket, and the all-gather after the optimizer step fills the bucket from those same parts. If every
bucket's length is a multiple of N the parts are equal, nothing is padded on the wire, and the rank
owns exactly part r of every bucket: that union is its shard of gradients and optimizer state (the
layout of Megatron's distributed optimizer). Bucket boundaries are the parameter boundaries of
`FlatLayout.buckets` snapped down to a multiple of N, so a parameter may straddle two buckets; a
bucket is ready when every parameter overlapping it has its gradient.
"""

from __future__ import annotations

from typing import NamedTuple

from engine.comm.shard import shard_bounds
from engine.parallel.data.flat import FlatLayout


class Bucket(NamedTuple):
    """Elements [start, end) of a flat buffer; `members` = indices of the parameters overlapping it."""
    start: int
    end: int
    members: tuple[int, ...]


def aligned_buckets(flat: FlatLayout, cap_bytes: float, world: int) -> list[Bucket]:
    """Buckets tiling the padded buffer (its size is a multiple of world), in reverse parameter order
    (the order backward produces gradients), each of a length that is a multiple of world."""
    if flat.size % world:
        raise ValueError(f"buffer of {flat.size} elements does not split into {world} parts")
    cuts = sorted({start - start % world for start, _ in flat.buckets(cap_bytes)} | {flat.size})
    buckets = []
    for start, end in zip(cuts[:-1], cuts[1:]):
        members = tuple(i for i, s in enumerate(flat.slots) if s.start < end and s.end > start)
        buckets.append(Bucket(start, end, members))
    return buckets[::-1]


def part(start: int, end: int, rank: int, world: int) -> tuple[int, int]:
    """Rank's equal part of [start, end) (length a multiple of world): what reduce-scatter leaves it."""
    return shard_bounds(end - start, world, rank, start)
