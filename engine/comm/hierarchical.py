"""Hierarchical all-reduce over a node grid (engine.comm.group.NodeGrid: M nodes of G ranks): keep the
bytes on the fast links inside a node and send only a shard over the slow ones between nodes.

  1. reduce-scatter inside the node (ring over the node's G ranks): local rank j holds shard j of the
     node's sum;
  2. all-reduce of that shard across the nodes (over the column of local rank j, one rank per node);
  3. all-gather inside the node.

Per rank: 2(G−1)/G·S bytes inside the node and 2(M−1)/M·S/G across nodes (when G divides n and M
divides the shard), against the flat ring's 2(N−1)/N·S, of which — ranks numbered node by node — every
node's last rank sends all of it to the next node. Cost (one NIC per rank): 2(G−1)α_in + 2(G−1)/G·nβ_in
+ 2(M−1)α_out + 2(M−1)/M·(n/G)·β_out.

Steps 1-2 alone are the gradient reduction of hybrid sharding (engine.parallel.data): every rank ends with its
node shard reduced over the whole world, replicated across the nodes. The inter-node step is a ring
unless the caller passes another all-reduce. avg divides the finished shard by N once.

The meter books steps 1 and 3 as algorithm "hierarchical" (groups node<m>) and step 2 as phase
"all-reduce" under the inter-node algorithm's own name (groups cross<j>), so a link shows what crossed.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from engine.comm import ring
from engine.comm.group import NodeGrid
from engine.comm.meter import metered, metered_phase
from engine.comm.reduction import check_buffer, divide, reducer

NAME = "hierarchical"

AllReduce = Callable[..., None]  # (comm, view, op) -> None, in place


def reduce_scatter(grid: NodeGrid, buf: np.ndarray, op: str, segment_bytes: int,
                   inter_all_reduce: AllReduce | None = None) -> tuple[int, int]:
    """Leave this rank's node shard of ``buf`` reduced over every rank of the grid; returns its (start,
    end) (``shard_bounds`` over the node's ranks)."""
    reducer(op, check_buffer(buf))  # refuse a bad op or dtype before any message moves
    partial = "sum" if op == "avg" else op
    meter = grid.comm.meter
    with metered(meter, "reduce-scatter", NAME):
        start, end = ring.reduce_scatter(grid.intra, buf, partial, segment_bytes)
    shard = buf[start:end]
    with metered_phase(meter, "all-reduce"):  # booked under the inter-node algorithm's own name
        if inter_all_reduce is None:
            ring.all_reduce(grid.inter, shard, partial, segment_bytes)
        else:
            inter_all_reduce(grid.inter, shard, partial)
    if op == "avg":
        divide(shard, grid.comm.world_size)
    return start, end


def all_gather(grid: NodeGrid, buf: np.ndarray, segment_bytes: int) -> None:
    """Step 3: the node's shards gathered inside the node."""
    with metered(grid.comm.meter, "all-gather", NAME):
        ring.all_gather(grid.intra, buf, segment_bytes)


def all_reduce(grid: NodeGrid, buf: np.ndarray, op: str, segment_bytes: int,
               inter_all_reduce: AllReduce | None = None) -> None:
    reduce_scatter(grid, buf, op, segment_bytes, inter_all_reduce)
    all_gather(grid, buf, segment_bytes)
