"""Process groups: a communicator over a subset of another communicator's ranks.

A Group is a view, not a transport: rank i of the group is rank ``ranks[i]`` of its parent, and every
send and receive goes through the parent's point-to-point calls with the rank translated, so a group
works on every backend (threads, processes, tcp, mpi) and shares the parent's timeout, stop and
failure signals and meter. The meter books a group's traffic under the group's name, with global
ranks, so a link shows which group (and which algorithm) used it. Collectives take a group wherever
they take a communicator: the ring's neighbours are the group's.

Creating a group is local (no communication): each rank builds the groups it belongs to. Every member
must then run the same collectives on the group in the same order, as on any communicator; messages
between two ranks keep their order across the parent and its groups (one FIFO per pair).

NodeGrid is the two-level layout of `parallel.ranks_per_node`: M nodes of G ranks, rank = node·G + local.
Its rows are the nodes (``intra``: this rank's node, named "node<m>"), its columns the ranks with the
same local index on every node (``inter``: named "cross<j>"), which is where hierarchical collectives
and hybrid sharding put their inter-node traffic.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engine.comm.base import Communicator, Reduce
from engine.comm.meter import TrafficMeter


class Group(Communicator):
    """Ranks ``ranks`` (of ``parent``, in group order) as a communicator; this rank must be one of them."""

    def __init__(self, parent: Communicator, ranks: Sequence[int], name: str):
        ranks = [int(r) for r in ranks]
        if len(set(ranks)) != len(ranks) or not all(0 <= r < parent.world_size for r in ranks):
            raise ValueError(f"group {name!r}: ranks {ranks} must be distinct ranks of a world of "
                             f"{parent.world_size}")
        if parent.rank not in ranks:
            raise ValueError(f"group {name!r}: rank {parent.rank} is not one of its ranks {ranks}")
        self.parent, self.ranks, self.name = parent, ranks, name
        super().__init__(ranks.index(parent.rank), len(ranks), parent.timeout_s, parent.meter, parent.signals)

    @property  # the parent's meter, whenever it is set
    def meter(self) -> TrafficMeter | None:
        return self.parent.meter

    @meter.setter
    def meter(self, meter: TrafficMeter | None) -> None:
        self.parent.meter = meter

    def global_rank(self, rank: int) -> int:
        return self.parent.global_rank(self.ranks[rank])

    def close(self) -> None:
        """Nothing to release: the parent owns the transport."""

    def _send(self, dst: int, arr: np.ndarray) -> None:
        self.parent._send(self.ranks[dst], arr)

    def _recv(self, src: int, out: np.ndarray, reduce: Reduce | None) -> None:
        self.parent._recv(self.ranks[src], out, reduce)

    def _sendrecv(self, dst: int, send_arr: np.ndarray, src: int, recv_arr: np.ndarray,
                  reduce: Reduce | None) -> None:
        self.parent._sendrecv(self.ranks[dst], send_arr, self.ranks[src], recv_arr, reduce)

    def _exchange(self, sends: list[tuple[int, np.ndarray]], recvs: list[tuple[int, np.ndarray]]) -> None:
        self.parent._exchange([(self.ranks[d], a) for d, a in sends], [(self.ranks[s], o) for s, o in recvs])

    def _post(self, sends: list[tuple[int, np.ndarray]], recvs: list[tuple[int, np.ndarray]]) -> object:
        ranks = self.ranks
        return self.parent._post([(ranks[d], a) for d, a in sends], [(ranks[s], o) for s, o in recvs])

    def _test(self, handle: object) -> bool:
        return self.parent._test(handle)

    def _complete(self, handle: object) -> None:
        self.parent._complete(handle)

    def _progress(self) -> None:
        self.parent._progress()


class NodeGrid:
    """``comm``'s ranks as nodes × ranks_per_node (0 = one node); ``intra`` and ``inter`` are this rank's
    row and column groups."""

    def __init__(self, comm: Communicator, ranks_per_node: int):
        size = comm.world_size
        per_node = ranks_per_node or size
        if per_node < 1 or size % per_node:
            raise ValueError(f"ranks_per_node {ranks_per_node} does not divide the world of {size} ranks")
        self.comm, self.ranks_per_node, self.nodes = comm, per_node, size // per_node
        self.node, self.local = divmod(comm.rank, per_node)
        self.intra = Group(comm, [self.node * per_node + j for j in range(per_node)], f"node{self.node}")
        self.inter = Group(comm, [m * per_node + self.local for m in range(self.nodes)], f"cross{self.local}")

    @property
    def two_level(self) -> bool:
        """More than one node, and more than one rank on each: where hierarchical collectives differ."""
        return self.nodes > 1 and self.ranks_per_node > 1
