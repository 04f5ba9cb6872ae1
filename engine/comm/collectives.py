"""The collectives, written once over Communicator point-to-point calls; transports only move bytes.

All work in place on a flat, C-contiguous 1-D buffer, on any communicator: the world or a process group
(engine.comm.group), whose ranks and ring neighbours are its own. Nothing is padded: only real elements
travel, so the meter counts exactly what moves.

    reduce_scatter, all_gather   the ring (ring.py); ZeRO builds on these two
    all_reduce                   one of ALGORITHMS:
      ring          reduce-scatter + all-gather around the ring (ring.py)
      rhd           recursive halving-doubling, Rabenseifner (halving.py)
      tree          binomial-tree reduce + broadcast (tree.py)
      hierarchical  reduce-scatter in the node, all-reduce across nodes, all-gather in the node
                    (hierarchical.py; needs a NodeGrid)
      auto          one of the four by message size, from measured crossovers (auto.py)
      mpi-native    MPI's own Allreduce, for comparison (mpi backend, world communicator only)
    broadcast                    pipelined chain from the root

Cost per all-reduce of n bytes on N ranks (α per message, β per byte; reduction γ as the ring's):
ring 2(N−1)α + 2(N−1)/N·nβ; rhd 2·lg N·α + 2(N−1)/N·nβ; tree 2·lg N·(α + nβ); hierarchical
2(G−1)α_in + 2(G−1)/G·nβ_in + 2(M−1)α_out + 2(M−1)/M·(n/G)·β_out. The crossovers "auto" uses are
measured on the machine, not derived from these.

Reductions: sum, avg, max (reduction.py). Every algorithm has exactly one rank compute each element's
final value and the others copy it, so all ranks end bitwise identical.
"""

from __future__ import annotations

import numpy as np

from engine.comm import auto, halving, hierarchical, ring, tree
from engine.comm.base import Communicator
from engine.comm.group import NodeGrid
from engine.comm.meter import metered
from engine.comm.reduction import OPS, check_buffer, segments
from engine.comm.shard import shard_bounds

SEGMENT_BYTES = 4 << 20
# The four algorithms "auto" chooses among (ring, rhd, tree, hierarchical), auto itself, and MPI's own.
ALGORITHMS = auto.CANDIDATES + ("auto", "mpi-native")
NEEDS_WORLD = ("hierarchical", "mpi-native")  # a node grid over the world; the MPI world communicator
ON_ANY_GROUP = tuple(a for a in ALGORITHMS if a not in NEEDS_WORLD)

__all__ = ["ALGORITHMS", "ON_ANY_GROUP", "OPS", "SEGMENT_BYTES", "all_gather", "all_reduce", "broadcast",
           "choose", "hierarchical_reduce_scatter", "reduce_scatter", "shard_bounds"]


def reduce_scatter(comm: Communicator, buf: np.ndarray, op: str = "sum", *,
                   segment_bytes: int = SEGMENT_BYTES) -> tuple[int, int]:
    """Leave this rank's shard (``shard_bounds``) of ``buf`` reduced over all ranks; returns its
    (start, end). The rest of ``buf`` holds partial sums afterwards."""
    return ring.reduce_scatter(comm, buf, op, segment_bytes)


def all_gather(comm: Communicator, buf: np.ndarray, *, segment_bytes: int = SEGMENT_BYTES) -> None:
    """Every rank contributes its shard (``shard_bounds``) of ``buf``; all end with the whole buffer."""
    ring.all_gather(comm, buf, segment_bytes)


def hierarchical_reduce_scatter(grid: NodeGrid, buf: np.ndarray, op: str = "sum", algorithm: str = "ring", *,
                                crossovers: auto.Crossovers | None = None,
                                segment_bytes: int = SEGMENT_BYTES) -> tuple[int, int]:
    """Reduce-scatter inside the node, then all-reduce this rank's node shard across the nodes with
    ``algorithm`` (one of ON_ANY_GROUP): the shard ends reduced over every rank of the grid, identical on
    every node. Returns its (start, end). Hybrid sharding's gradient reduction."""
    if algorithm not in ON_ANY_GROUP:
        raise ValueError(f"the inter-node step runs on a group of one rank per node: algorithm must be one "
                         f"of {ON_ANY_GROUP}, got {algorithm!r}")

    def across(comm: Communicator, view: np.ndarray, op: str) -> None:
        all_reduce(comm, view, op, algorithm, crossovers=crossovers, segment_bytes=segment_bytes)
    return hierarchical.reduce_scatter(grid, buf, op, segment_bytes, across)


def choose(comm: Communicator, buf: np.ndarray, grid: NodeGrid | None = None,
           crossovers: auto.Crossovers | None = None) -> str:
    """The algorithm "auto" runs for ``buf`` on ``comm``: the crossovers' (default ones without)."""
    two_level = grid is not None and grid.two_level
    table = crossovers if crossovers is not None else auto.default(comm.world_size, two_level)
    chosen = table.choose(buf.nbytes)
    return "ring" if chosen == "hierarchical" and not two_level else chosen


def all_reduce(comm: Communicator, buf: np.ndarray, op: str = "sum", algorithm: str = "ring", *,
               grid: NodeGrid | None = None, crossovers: auto.Crossovers | None = None,
               segment_bytes: int = SEGMENT_BYTES) -> None:
    """In place: ``buf`` ends as the reduction over all ranks of ``comm``, bitwise identical everywhere.
    "hierarchical" needs ``grid``, the node grid over ``comm``; "auto" picks by size (``choose``)."""
    if algorithm == "auto":
        algorithm = choose(comm, buf, grid, crossovers)
    if algorithm == "ring":
        ring.all_reduce(comm, buf, op, segment_bytes)
    elif algorithm == "rhd":
        halving.all_reduce(comm, buf, op, segment_bytes)
    elif algorithm == "tree":
        tree.all_reduce(comm, buf, op, segment_bytes)
    elif algorithm == "hierarchical":
        if grid is None or grid.comm is not comm:
            raise ValueError("algorithm 'hierarchical' needs the node grid of this communicator "
                             "(grid=NodeGrid(comm, ranks_per_node))")
        hierarchical.all_reduce(grid, buf, op, segment_bytes)
    elif algorithm == "mpi-native":
        native = getattr(comm, "native_all_reduce", None)
        if native is None:
            raise ValueError("algorithm 'mpi-native' needs the mpi backend's world communicator; "
                             "use algorithm='ring'")
        native(buf, op)
    else:
        raise ValueError(f"unknown all-reduce algorithm {algorithm!r}; expected one of {ALGORITHMS}")


def broadcast(comm: Communicator, buf: np.ndarray, root: int = 0, *,
              segment_bytes: int = SEGMENT_BYTES) -> None:
    """Copy ``root``'s buffer to every rank through a pipelined chain root → root+1 → …, segment by
    segment, so every link carries S bytes once (busbw factor 1)."""
    check_buffer(buf)
    size = comm.world_size
    position = (comm.rank - root) % size
    nxt, prv = (comm.rank + 1) % size, (comm.rank - 1) % size
    with metered(comm.meter, "broadcast", "chain"):
        for segment in segments(buf, segment_bytes):
            if position > 0:
                comm.recv(prv, segment)
            if position < size - 1:
                comm.send(nxt, segment)
