"""Recursive halving-doubling all-reduce (Rabenseifner): ring's bandwidth in logarithmic steps.

With P = N a power of two: lg P halving steps, each exchanging half of the rank's current range with
the partner at distance P/2, P/4, …, 1 (rank r keeps the lower half when its bit is clear), leave rank r
holding chunk r of the buffer reduced over all ranks (the chunks are ``shard_bounds(n, P, c)``); lg P
doubling steps in reverse order gather the chunks back. Each rank sends n − |chunk r| in halving and
as much again in doubling: 2(P−1)/P·S when P divides n, as the ring, but in 2·lg P steps instead of
2(N−1).

N not a power of two (MPICH's way, Thakur, Rabenseifner & Gropp 2005): with P the largest power of two
below N and E = N − P, ranks 0 … 2E−1 pair up first: each even rank sends its whole buffer to the odd
rank above it ("reduce" phase) and sits out; the P remaining ranks run the algorithm above; then each
odd rank sends the result back ("broadcast" phase). Those 2E ranks send S more each.

Cost: 2·lg P·α + 2(P−1)/P·nβ + (P−1)/P·nγ (+ 2(α + nβ) + nγ when N is not a power of two): the
bandwidth of the ring with the latency of a tree, so it wins at medium sizes and on many ranks.
Each chunk is reduced by one rank, then copied: all ranks end bitwise identical.
"""

from __future__ import annotations

import numpy as np

from engine.comm.base import Communicator
from engine.comm.meter import metered
from engine.comm.reduction import check_buffer, divide, exchange, reducer, segments
from engine.comm.shard import shard_bounds

NAME = "rhd"


def participants(world_size: int) -> tuple[int, int]:
    """(P, E): the power of two that runs halving-doubling, and the ranks folded into it."""
    power = 1 << (world_size.bit_length() - 1)
    return power, world_size - power


def chunk_of(rank: int, world_size: int) -> int | None:
    """Which of the P chunks ``rank`` reduces (its index among the participants), or None when it is an
    even rank folded into its odd neighbour."""
    _, extra = participants(world_size)
    if rank < 2 * extra:
        return rank // 2 if rank % 2 else None
    return rank - extra


def all_reduce(comm: Communicator, buf: np.ndarray, op: str, segment_bytes: int) -> None:
    reduce = reducer(op, check_buffer(buf))
    size, rank = comm.world_size, comm.rank
    power, extra = participants(size)
    me = chunk_of(rank, size)
    with metered(comm.meter, "reduce", NAME):
        if me is None:
            _send(comm, rank + 1, buf, segment_bytes)
        elif rank < 2 * extra:
            _recv(comm, rank - 1, buf, reduce, segment_bytes)
    if me is not None:
        real = [v * 2 + 1 if v < extra else v + extra for v in range(power)]  # participant -> rank
        bounds = [shard_bounds(buf.size, power, c) for c in range(power)]

        def span(lo: int, hi: int) -> np.ndarray:  # elements of chunks [lo, hi)
            return buf[bounds[lo][0]:bounds[hi - 1][1]]

        lo, hi = 0, power
        with metered(comm.meter, "reduce-scatter", NAME):
            distance = power // 2
            while distance:
                mid, partner = (lo + hi) // 2, real[me ^ distance]
                keep, give = ((lo, mid), (mid, hi)) if me & distance == 0 else ((mid, hi), (lo, mid))
                exchange(comm, partner, span(*give), partner, span(*keep), reduce, segment_bytes)
                lo, hi = keep
                distance //= 2
        if op == "avg":
            divide(span(lo, hi), size)
        with metered(comm.meter, "all-gather", NAME):
            distance = 1
            while distance < power:
                partner = real[me ^ distance]
                other = (lo - (hi - lo), lo) if me & distance else (hi, hi + (hi - lo))
                exchange(comm, partner, span(lo, hi), partner, span(*other), None, segment_bytes)
                lo, hi = min(lo, other[0]), max(hi, other[1])
                distance *= 2
    with metered(comm.meter, "broadcast", NAME):
        if me is None:
            _recv(comm, rank + 1, buf, None, segment_bytes)
        elif rank < 2 * extra:
            _send(comm, rank - 1, buf, segment_bytes)


def _send(comm: Communicator, dst: int, buf: np.ndarray, segment_bytes: int) -> None:
    for segment in segments(buf, segment_bytes):
        comm.send(dst, segment)


def _recv(comm: Communicator, src: int, buf: np.ndarray, reduce, segment_bytes: int) -> None:
    for segment in segments(buf, segment_bytes):
        comm.recv(src, segment, reduce)
