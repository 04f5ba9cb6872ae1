"""The engine's ring on a buffer with fewer elements than ranks, message by message.

The ring cuts a buffer of n elements into one shard per rank (engine.comm.shard.shard_bounds); with n < p
ranks, p − n shards are empty and the engine sends nothing for them (engine.comm.ring). The small all-reduces
every step makes — the gradient norm (1 fp64 element), the overflow flag (2), the loss (3) — are such
buffers, so they are not 2(p−1) steps of the slowest link each, as the closed form says: each non-empty
shard travels the ring as a chain of one-element messages, p − 1 hops per half, every hop on its own link.
Between two nodes of a ring only the hops that cross nodes pay the slow link; the rest are fast.

Replayed here as the transport runs it (engine.comm.tcp): in ring step s, rank r sends one shard to r + 1
and receives one from r − 1 at once; a send ends when the link has delivered it (an emulated link holds
the sender until then), a receive when its message has arrived (and, in reduce-scatter, been reduced).
So rank r ends step s at

    max(its end of step s − 1 + its send,  its left neighbour's end of step s − 1 + that neighbour's send)

with either term left out when that shard is empty. Only the ranks a non-empty shard touches in a step
change, so a step costs O(n), not O(p): a 4,096-rank ring of one element is 8,190 updates.
"""

from __future__ import annotations

import functools

from engine.comm.shard import shard_bounds
from engine.projection.collective_times import Link, Topology


def _links(topo: Topology) -> list[Link]:
    """The link each rank sends its ring messages on: to the next rank, across nodes or inside one."""
    p, g = topo.ranks, topo.per_node
    return [topo.intra if r // g == ((r + 1) % p) // g else topo.inter for r in range(p)]


def _half(topo: Topology, lengths: list[int], itemsize: int, gamma: float, first: int,
          done: list[float]) -> list[float]:
    """Every rank's end of a ring half started at `done` (per rank): shard j leaves rank j + first in
    step 0 and moves one rank on per step (first = 1: reduce-scatter, 0: all-gather)."""
    p, links = topo.ranks, _links(topo)
    chains = [(j, lengths[j] * itemsize) for j in range(p) if lengths[j]]
    done = list(done)
    for step in range(p - 1):
        ends: dict[int, float] = {}
        for j, nbytes in chains:
            sender = (j + first + step) % p
            receiver = (sender + 1) % p
            delivered = done[sender] + links[sender].p2p(nbytes)
            ends[sender] = max(ends.get(sender, done[sender]), delivered)
            ends[receiver] = max(ends.get(receiver, done[receiver]), delivered + nbytes * gamma)
        for rank, end in ends.items():
            done[rank] = end
    return done


def shard_lengths(elements: int, ranks: int) -> list[int]:
    return [b - a for a, b in (shard_bounds(elements, ranks, r) for r in range(ranks))]


def sparse_reduce_scatter(topo: Topology, elements: int, itemsize: int, gamma: float,
                          start: list[float] | None = None) -> list[float]:
    """Per rank, when its reduce-scatter of `elements` ends (all ranks starting at 0, or at `start`)."""
    return _half(topo, shard_lengths(elements, topo.ranks), itemsize, gamma, 1, start or [0.0] * topo.ranks)


def sparse_all_gather(topo: Topology, elements: int, itemsize: int,
                      start: list[float] | None = None) -> list[float]:
    return _half(topo, shard_lengths(elements, topo.ranks), itemsize, 0.0, 0, start or [0.0] * topo.ranks)


@functools.lru_cache(maxsize=256)  # a projection asks for the same few per world size, and a big ring is slow
def sparse_all_reduce(topo: Topology, elements: int, itemsize: int) -> float:
    """Seconds until the last rank's all-reduce ends: reduce-scatter, then each rank's all-gather from
    where its reduce-scatter ended."""
    scattered = sparse_reduce_scatter(topo, elements, itemsize, topo.gamma)
    return max(sparse_all_gather(topo, elements, itemsize, scattered))
