"""Ring reduce-scatter and all-gather: the bandwidth-optimal algorithm, and the parts of every other.

The buffer of n elements is cut into N shards with ``shard_bounds`` (sizes differ by at most one; some
are empty when n < N). Nothing is padded: only real elements travel. Rank r sends S − |shard r| in
reduce-scatter and S − |shard r+1| in all-gather; when N divides n that is (N−1)/N·S each, 2(N−1)/N·S
for an all-reduce, in 2(N−1) steps to the next rank of the communicator (of the group, for a group).

Cost (α per message, β per byte, γ per byte reduced): 2(N−1)α + 2(N−1)/N·nβ + (N−1)/N·nγ for an
all-reduce: the least bandwidth of all, the most latency.

Overlap: each ring step moves its shard in segments, received with reduce-on-receive: the transport
reduces each piece as it lands, while the peer is still writing the next one. Each shard is reduced by
exactly one rank and then copied, so all ranks end bitwise identical.
"""

from __future__ import annotations

import numpy as np

from engine.comm.base import Communicator
from engine.comm.meter import metered
from engine.comm.reduction import check_buffer, divide, exchange, reducer
from engine.comm.shard import shard_bounds

NAME = "ring"


def reduce_scatter(comm: Communicator, buf: np.ndarray, op: str, segment_bytes: int) -> tuple[int, int]:
    """Leave this rank's shard of ``buf`` reduced over all ranks; returns its (start, end).
    The rest of ``buf`` holds partial sums afterwards."""
    reduce = reducer(op, check_buffer(buf))
    n, size, rank = buf.size, comm.world_size, comm.rank
    shard = [shard_bounds(n, size, r) for r in range(size)]
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    with metered(comm.meter, "reduce-scatter", NAME):
        # Step s: send shard r−s−1 (holding s+1 contributions), fold the incoming shard r−s−2 into
        # ours; after N−1 steps shard r has all N contributions.
        for step in range(size - 1):
            out, inc = shard[(rank - step - 1) % size], shard[(rank - step - 2) % size]
            exchange(comm, nxt, buf[out[0]:out[1]], prv, buf[inc[0]:inc[1]], reduce, segment_bytes)
    start, end = shard[rank]
    if op == "avg":
        divide(buf[start:end], size)
    return start, end


def all_gather(comm: Communicator, buf: np.ndarray, segment_bytes: int) -> None:
    """Every rank contributes its shard (``shard_bounds``) of ``buf``; all end with the whole buffer."""
    check_buffer(buf)
    n, size, rank = buf.size, comm.world_size, comm.rank
    shard = [shard_bounds(n, size, r) for r in range(size)]
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    with metered(comm.meter, "all-gather", NAME):
        for step in range(size - 1):
            out, inc = shard[(rank - step) % size], shard[(rank - step - 1) % size]
            exchange(comm, nxt, buf[out[0]:out[1]], prv, buf[inc[0]:inc[1]], None, segment_bytes)


def all_reduce(comm: Communicator, buf: np.ndarray, op: str, segment_bytes: int) -> None:
    """Reduce-scatter then all-gather."""
    reduce_scatter(comm, buf, op, segment_bytes)
    all_gather(comm, buf, segment_bytes)
