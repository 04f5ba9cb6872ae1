"""How a replica's collectives run: the all-reduce algorithm, the node grid, the crossovers "auto" uses,
and where ZeRO shards.

Flat (the default): ZeRO shards over the whole world; gradients are reduce-scattered over it.
Hybrid sharding (`parallel.hybrid`, stages 1-3): ZeRO shards inside each node of the grid
(`parallel.ranks_per_node` ranks) and every node holds the same shards — sharded inside, replicated
across, as PyTorch FSDP's HYBRID_SHARD. A gradient bucket is reduce-scattered inside the node and its
node shard all-reduced across the nodes (the hierarchical all-reduce's first two steps, with
`parallel.algorithm` on the inter-node step); parameters are all-gathered inside the node only. Only
1/G of the gradient crosses the slow links, and nothing else does, at the price of G-way instead of
N-way sharding of the model states.

"auto": rank 0 reads the tuning file (engine.comm.auto) and broadcasts its tables, so every rank picks
the same algorithm for the same buffer even when the ranks' machines hold different files.
"""

from __future__ import annotations

import numpy as np

from engine.comm import auto
from engine.comm.collectives import (
    all_gather,
    all_reduce,
    broadcast,
    hierarchical_reduce_scatter,
    reduce_scatter,
)
from engine.comm.emulation import EMULATION_KEYS
from engine.comm.group import NodeGrid


def tables(cfg) -> tuple[auto.Crossovers, auto.Crossovers]:
    """The crossovers "auto" uses for this config (measured ones from the tuning file, else the defaults):
    for the all-reduce over the world, and for hybrid sharding's over one rank per node. Raises
    auto.TuningError on an unusable tuning file (checked before a run starts)."""
    p = cfg.parallel
    path = auto.tuning_path(p.tuning_file)
    per_node = p.ranks_per_node or p.world_size
    two_level = 1 < per_node < p.world_size
    nodes = p.world_size // per_node
    network = auto.network_key({k: getattr(cfg.emulate, k) for k in EMULATION_KEYS})  # as bench measured it
    world = auto.lookup(path, auto.key(p.backend, p.world_size, p.ranks_per_node, network), p.world_size,
                        two_level)
    across = auto.lookup(path, auto.key(p.backend, nodes, 1, network), nodes, False)
    return world, across


class Topology:
    """One rank's view: the world communicator, the node grid (None without `ranks_per_node`), the
    communicator ZeRO shards over (`shard_comm`) and the all-reduce settings."""

    def __init__(self, cfg, comm):
        p = cfg.parallel
        self.comm, self.algorithm = comm, p.algorithm
        # The node grid lays out the world's ranks; a data-parallel group smaller than the world (tensor
        # parallelism holds the rest) has no grid of its own: its collectives run flat.
        whole_world = comm.world_size == p.world_size
        self.grid = NodeGrid(comm, p.ranks_per_node) if p.ranks_per_node and whole_world else None
        self.hybrid = bool(p.hybrid) and self.grid is not None
        self.shard_comm = self.grid.intra if self.hybrid and self.grid is not None else comm
        self.crossovers = self.cross_crossovers = None
        if self.algorithm == "auto":
            self.crossovers, self.cross_crossovers = self._agreed(cfg)

    def _agreed(self, cfg) -> tuple[auto.Crossovers, auto.Crossovers]:
        """Rank 0's tables, on every rank."""
        rows = 2 * auto.MAX_RULES
        buf = np.zeros(2 * rows)
        if self.comm.rank == 0:
            world, across = tables(cfg)
            buf[:rows], buf[rows:] = world.to_array(), across.to_array()
        if self.comm.world_size > 1:
            broadcast(self.comm, buf, root=0)
        return auto.Crossovers.from_array(buf[:rows]), auto.Crossovers.from_array(buf[rows:])

    def all_reduce(self, buf: np.ndarray, op: str) -> None:
        """DDP's all-reduce of a bucket over the world, with the configured algorithm."""
        all_reduce(self.comm, buf, op, self.algorithm, grid=self.grid, crossovers=self.crossovers)

    def reduce_scatter(self, buf: np.ndarray, op: str) -> tuple[int, int]:
        """Leave this rank's part (over `shard_comm`) of a gradient group reduced over the world."""
        if self.hybrid:
            assert self.grid is not None  # hybrid implies a grid
            return hierarchical_reduce_scatter(self.grid, buf, op, self.algorithm,
                                               crossovers=self.cross_crossovers)
        return reduce_scatter(self.shard_comm, buf, op)

    def all_gather(self, buf: np.ndarray) -> None:
        """Gather a group's parts over `shard_comm` (the node, under hybrid sharding)."""
        all_gather(self.shard_comm, buf)
