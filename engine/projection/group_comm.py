"""Collective times in one process group of a run: the group's ranks placed on the machine's nodes (the
mesh, engine.parallel.mesh), then the alpha-beta-gamma forms of collective_times.py on that placement.

A group's members come from the mesh's coordinates (Mesh.rank_of): with TP innermost a tensor-parallel
group of t ranks is t adjacent ranks — one node's when t divides ranks_per_node (the intra-node link); a
larger one spans nodes, and so does one that t does not divide where it straddles a node's end. The
data-parallel group (DP × CP) takes every t-th rank, so it spans the nodes with ranks_per_node / t of its
ranks on each. The pipeline group (pp outermost by default) takes every (world/p)-th rank: its neighbours
sit on two nodes once the world exceeds one. The context-parallel group (cp next to tp) is c ranks t apart.
The expert groups are carved out of one (pp, tp) cell's DP × CP ranks as the mesh carves them
(engine.parallel.mesh): ep consecutive members of it when ep comes before dp in the order (the default), every
(dp·cp/ep)-th otherwise, and edp the rest of the split. Every step waits for every group (the gradient reduce
joins them), so the group of a kind that spans the most nodes is the one costed.

Point-to-point patterns (ring attention's hops, the all-to-all's pairwise steps: every member sends to the
member k places on at once) wait for their slowest pair: `shift_link` is the inter-node link when any pair
of the shift sits on two nodes, else the intra-node one.
"""

from __future__ import annotations

from engine.parallel.mesh import Mesh
from engine.projection.collective_times import Link, Topology, all_reduce_time, half_collective_time
from engine.projection.machine import Machine
from engine.projection.sparse_ring import sparse_all_reduce


def group_members(parallel, kind: str, per_node: int) -> list[int]:
    """The ranks of the group of `kind` ("tp"; "pp"; "cp"; "dpcp", the gradient reduce; "ep" and "edp", the
    experts' all-to-alls and their gradient reduce; "world") that spans the most
    nodes of `per_node` ranks. From the coordinates, not Mesh.members, whose tables for thousands of ranks
    take seconds."""
    mesh = Mesh.of(parallel)
    if kind == "world":
        return list(range(mesh.world_size))
    if kind == "tp":
        groups = [[mesh.rank_of(dp=d, pp=p, cp=c, tp=i) for i in range(mesh.tp)]
                  for d in range(mesh.dp) for p in range(mesh.pp) for c in range(mesh.cp)]
    elif kind == "pp":
        groups = [[mesh.rank_of(dp=d, pp=i, cp=c, tp=t) for i in range(mesh.pp)]
                  for d in range(mesh.dp) for c in range(mesh.cp) for t in range(mesh.tp)]
    elif kind == "cp":
        groups = [[mesh.rank_of(dp=d, pp=p, cp=i, tp=t) for i in range(mesh.cp)]
                  for d in range(mesh.dp) for p in range(mesh.pp) for t in range(mesh.tp)]
    elif kind in ("dpcp", "ep", "edp"):
        groups = [sorted(mesh.rank_of(dp=d, cp=c, pp=p, tp=i) for d in range(mesh.dp) for c in range(mesh.cp))
                  for p in range(mesh.pp) for i in range(mesh.tp)]
        if kind != "dpcp":  # the mesh's split of each cell (Mesh._group): consecutive runs or strides
            size = mesh.ep if mesh.ep_inner else mesh.degree("edp")
            strided = (kind == "edp") == mesh.ep_inner
            groups = [cell[j::size] if strided else cell[j * size:(j + 1) * size]
                      for cell in groups for j in range(size if strided else len(cell) // size)]
    else:
        raise ValueError(f"no placement for group kind {kind!r}")
    return max(groups, key=lambda g: len({r // per_node for r in g}))


def shift_link(machine: Machine, members: list[int], k: int) -> Link:
    """The link every member's message to the member k places on (cyclically) waits for: inter-node when any
    such pair sits on two nodes."""
    per_node, n = machine.topology.per_node, len(members)
    crosses = any(members[i] // per_node != members[(i + k) % n] // per_node for i in range(n))
    return machine.topology.inter if crosses else machine.topology.intra


class GroupComm:
    """Collective times on a group of the machine's ranks, with their CPU part for interference (at most
    the collective's own seconds: one thread runs it)."""

    def __init__(self, machine: Machine, members: list[int] | None = None):
        self.m = machine
        self.topology: Topology = machine.topology
        self.cpu_topology: Topology | None = machine.cpu_topology
        if members is not None:
            self.topology = machine.topology.subgroup(members)
            if machine.cpu_topology is not None:
                self.cpu_topology = machine.cpu_topology.subgroup(members)

    @property
    def ranks(self) -> int:
        return self.topology.ranks

    def all_reduce(self, nbytes: float) -> tuple[float, float]:
        _, seconds = all_reduce_time(self.topology, nbytes, self.m.algorithm)
        cpu = all_reduce_time(self.cpu_topology, nbytes, "ring")[1] if self.cpu_topology else 0.0
        return seconds, min(cpu, seconds)

    def scalars(self, count: int) -> tuple[float, float]:
        """An all-reduce of `count` fp64 values (the gradient norm, the overflow flag, the loss). On the
        engine's ring, fewer values than ranks leave shards empty, which send nothing: the message-by-message
        replay (sparse_ring), not the closed form, says what it costs."""
        if self.m.algorithm != "ring" or count >= self.topology.ranks:
            return self.all_reduce(8 * count)
        seconds = sparse_all_reduce(self.topology, count, 8)
        cpu = sparse_all_reduce(self.cpu_topology, count, 8) if self.cpu_topology else 0.0
        return seconds, min(cpu, seconds)

    def half(self, nbytes: float, reduce: bool) -> tuple[float, float]:
        """A reduce-scatter (reduce=True) or an all-gather of an n-byte buffer."""
        seconds = half_collective_time(self.topology, nbytes, reduce, self.m.algorithm)
        cpu = 0.0
        if self.cpu_topology is not None:
            cpu = half_collective_time(self.cpu_topology, nbytes, reduce, "ring")
        return seconds, min(cpu, seconds)
