"""Binomial-tree all-reduce: a reduce to rank 0 up the tree, then a broadcast down it. For small
messages, where the number of steps matters more than the bytes.

Reduce: in round k (k = 0, 1, …) every rank whose lowest set bit is 2^k sends its partial sum to the
rank 2^k below it and leaves; the others fold in what arrives from 2^k above. Broadcast: the same tree
the other way, each rank forwarding to its children from the largest distance down. Every rank but 0
sends S up once; a rank sends S down once per child (rank r's children are r + 2^j for 2^j below r's
lowest set bit, and below N).

Cost: 2·⌈lg N⌉·(α + nβ) + ⌈lg N⌉·nγ: as few steps as halving-doubling, but whole buffers in every
step, so it only wins while α dominates. Rank 0 reduces everything and the others copy it: all ranks
end bitwise identical.
"""

from __future__ import annotations

import numpy as np

from engine.comm.base import Communicator
from engine.comm.meter import metered
from engine.comm.reduction import check_buffer, divide, reducer, segments

NAME = "tree"


def children(rank: int, world_size: int) -> list[int]:
    """The ranks ``rank`` sends to in the broadcast (and receives from in the reduce), farthest first."""
    low = rank & -rank if rank else 1 << max(world_size - 1, 0).bit_length()
    out, distance = [], low >> 1
    while distance:
        if rank + distance < world_size:
            out.append(rank + distance)
        distance >>= 1
    return out


def all_reduce(comm: Communicator, buf: np.ndarray, op: str, segment_bytes: int) -> None:
    reduce = reducer(op, check_buffer(buf))
    rank = comm.rank
    parent = rank - (rank & -rank) if rank else None
    with metered(comm.meter, "reduce", NAME):
        for child in reversed(children(rank, comm.world_size)):  # nearest first: it finishes first
            for segment in segments(buf, segment_bytes):
                comm.recv(child, segment, reduce)
        if parent is not None:
            for segment in segments(buf, segment_bytes):
                comm.send(parent, segment)
    if parent is None and op == "avg":
        divide(buf, comm.world_size)
    with metered(comm.meter, "broadcast", NAME):
        if parent is not None:
            for segment in segments(buf, segment_bytes):
                comm.recv(parent, segment)
        for child in children(rank, comm.world_size):
            for segment in segments(buf, segment_bytes):
                comm.send(child, segment)
