"""What a collective costs: the alpha-beta-gamma forms, and the choice of algorithm per message size.

Notation: α seconds per message, β seconds per byte on a link, γ seconds per byte reduced, n the buffer's
bytes, p ranks. A point-to-point message of m bytes costs α + m·β (Hockney); its effective bandwidth is
peak·m / (m + n½) with n½ = α/β. The collective forms, written per ring/tree step so any link model
plugs in (with a Hockney link they are exactly the published forms):

    ring all-reduce           2(p−1)·(α + n/p·β) + (p−1)/p·n·γ   = 2(p−1)α + 2(p−1)/p·nβ + (p−1)/p·nγ
    ring reduce-scatter       (p−1)·(α + n/p·β) + (p−1)/p·n·γ     (all-gather: the same without γ)
    recursive doubling        ⌈lg p⌉·(α + nβ + nγ)                  (small messages)
    Rabenseifner              2·lg p·α + 2(p−1)/p·nβ + (p−1)/p·nγ  (halving-doubling)
    binary tree               2·lg p·(α + nβ) + lg p·nγ
    hierarchical (G per node, M nodes)
                              2(G−1)α_in + 2(G−1)/G·nβ_in + (G−1)/G·nγ            intra-node RS + AG
                              + 2(M−1)α_out + 2(M−1)/M·(n/G)·β_out + (M−1)/M·(n/G)·γ   inter-node, per NIC
      with one NIC per node instead of per rank, the inter-node term carries n, not n/G.

Across nodes a flat algorithm waits for its slowest link each step: the ring's step time is the slower of
an intra-node and an inter-node message. nanoDist's own ring (engine.comm.collectives) is one ring that
also cuts every step's message into segments of SEGMENT_BYTES, each a message of its own; NCCL runs one
ring per NIC in parallel (its channels), so with a NIC per rank the inter-node share of each ring is n/G.

The choice per size is NCCL's (src/graph/tuning.cc): predict every algorithm it may use and take the
fastest. `algorithm="auto"` does that; "ring" is the engine's single segmented ring.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from engine.comm.collectives import SEGMENT_BYTES

AUTO_CANDIDATES = ("ring", "tree", "recursive-doubling", "rabenseifner", "hierarchical")
NIC_KINDS = ("rank", "node")  # one NIC per rank (DGX), or one per node shared by its ranks


@dataclass(frozen=True)
class Link:
    """A point-to-point link: α seconds per message, β seconds per byte. An emulated link rides on a real
    one: its last piece (`piece` bytes at most) still crosses the real link at `host_beta` s/byte."""

    alpha: float
    beta: float
    host_beta: float = 0.0
    piece: int = 0

    def p2p(self, m: float) -> float:
        """Seconds for one message of m bytes: Hockney's α + m·β (plus an emulated link's last piece)."""
        return self.alpha + m * self.beta + min(m, self.piece) * self.host_beta

    @property
    def half_bandwidth_bytes(self) -> float:
        """n½ = α/β: the message size that reaches half the peak bandwidth."""
        return self.alpha / self.beta if self.beta else math.inf

    def effective_bandwidth(self, m: float) -> float:
        """Bytes per second a message of m bytes achieves: peak·m / (m + n½)."""
        return m / self.p2p(m) if m else 0.0


def _steps(link: Link, m: float, segment: float | None) -> float:
    """One step's message of m bytes, cut into segments of `segment` bytes (None: one message)."""
    if not segment or m <= segment:
        return link.p2p(m)
    whole, rest = divmod(m, segment)
    return whole * link.p2p(segment) + (link.p2p(rest) if rest else 0.0)


def ring_all_reduce(p: int, n: float, link: Link, gamma: float, segment: float | None = None) -> float:
    if p == 1:
        return 0.0
    return 2 * (p - 1) * _steps(link, n / p, segment) + (p - 1) / p * n * gamma


def ring_reduce_scatter(p: int, n: float, link: Link, gamma: float, segment: float | None = None) -> float:
    if p == 1:
        return 0.0
    return (p - 1) * _steps(link, n / p, segment) + (p - 1) / p * n * gamma


def ring_all_gather(p: int, n: float, link: Link, segment: float | None = None) -> float:
    return ring_reduce_scatter(p, n, link, 0.0, segment)


def recursive_doubling(p: int, n: float, link: Link, gamma: float) -> float:
    if p == 1:
        return 0.0
    return math.ceil(math.log2(p)) * (link.p2p(n) + n * gamma)


def rabenseifner(p: int, n: float, link: Link, gamma: float) -> float:
    if p == 1:
        return 0.0
    rounds = math.ceil(math.log2(p))
    return 2 * rounds * link.alpha + 2 * (p - 1) / p * n * link.beta + (p - 1) / p * n * gamma


def binary_tree(p: int, n: float, link: Link, gamma: float) -> float:
    if p == 1:
        return 0.0
    rounds = math.ceil(math.log2(p))
    return 2 * rounds * link.p2p(n) + rounds * n * gamma


def hierarchical(per_node: int, nodes: int, n: float, intra: Link, inter: Link, gamma: float,
                 nic: str = "rank") -> float:
    """Intra-node reduce-scatter + all-gather around an inter-node all-reduce of each rank's 1/G share."""
    g, m = per_node, nodes
    inner = 2 * (g - 1) * intra.alpha + 2 * (g - 1) / g * n * intra.beta + (g - 1) / g * n * gamma
    share = n / g if nic == "rank" else n
    outer = 2 * (m - 1) * inter.alpha + 2 * (m - 1) / m * share * inter.beta + (m - 1) / m * (n / g) * gamma
    return inner + (outer if m > 1 else 0.0)


@dataclass(frozen=True)
class Topology:
    """Where the ranks of one collective sit: `ranks` in nodes of `per_node`, and the links between them."""

    ranks: int
    per_node: int
    intra: Link
    inter: Link
    gamma: float
    nic: str = "rank"

    @property
    def nodes(self) -> int:
        return max(1, math.ceil(self.ranks / self.per_node))

    def bottleneck(self, rings: int = 1) -> Link:
        """The link a flat algorithm waits for each step: the slower of intra- and inter-node messages,
        with the inter-node bytes spread over `rings` parallel rings (one per NIC)."""
        if self.nodes == 1:
            return self.intra
        out = Link(self.inter.alpha, self.inter.beta / rings, self.inter.host_beta, self.inter.piece)
        return Link(max(self.intra.alpha, out.alpha), max(self.intra.beta, out.beta),
                    max(self.intra.host_beta, out.host_beta), max(self.intra.piece, out.piece))

    @property
    def nic_rings(self) -> int:
        return min(self.per_node, self.ranks) if self.nic == "rank" else 1

    def subgroup(self, members: Sequence[int]) -> Topology:
        """Where a group of these ranks (ranks of this topology's world, node = rank // per_node) sits: its
        ranks per node (the most on one node). With one NIC per node, the groups of its kind that share a
        node cross the network at once, each at that share of the NIC's bandwidth."""
        if len(members) == self.ranks:
            return self
        per_node = max(Counter(r // self.per_node for r in members).values())
        inter = self.inter
        if self.nic == "node":
            sharing = min(self.per_node, self.ranks) // per_node
            inter = Link(inter.alpha, inter.beta * sharing, inter.host_beta, inter.piece)
        return Topology(len(members), per_node, self.intra, inter, self.gamma, self.nic)


def all_reduce_time(topo: Topology, n: float, algorithm: str = "ring") -> tuple[str, float]:
    """(algorithm used, seconds) for an all-reduce of n bytes. "ring": nanoDist's single segmented ring;
    "auto": the fastest of AUTO_CANDIDATES at this size, as NCCL's tuner picks."""
    if topo.ranks == 1 or n == 0:
        return algorithm, 0.0
    if algorithm == "ring":
        return "ring", ring_all_reduce(topo.ranks, n, topo.bottleneck(), topo.gamma, SEGMENT_BYTES)
    if algorithm != "auto":
        raise ValueError(f"unknown algorithm {algorithm!r}; expected ring or auto")
    p, flat = topo.ranks, topo.bottleneck(topo.nic_rings)
    times = {"ring": ring_all_reduce(p, n, flat, topo.gamma),
             "tree": binary_tree(p, n, topo.bottleneck(), topo.gamma),
             "recursive-doubling": recursive_doubling(p, n, topo.bottleneck(), topo.gamma),
             "rabenseifner": rabenseifner(p, n, flat, topo.gamma)}
    if topo.nodes > 1 and topo.ranks % topo.per_node == 0:
        times["hierarchical"] = hierarchical(topo.per_node, topo.nodes, n, topo.intra, topo.inter, topo.gamma,
                                             topo.nic)
    best = min(times, key=times.__getitem__)
    return best, times[best]


def half_collective_time(topo: Topology, n: float, reduce: bool, algorithm: str = "ring") -> float:
    """A ring reduce-scatter (reduce=True) or all-gather of n bytes: ZeRO's halves of the all-reduce.
    nanoDist segments its ring; NCCL ("auto") runs one ring per NIC."""
    if topo.ranks == 1 or n == 0:
        return 0.0
    gamma = topo.gamma if reduce else 0.0
    if algorithm == "ring":
        return ring_reduce_scatter(topo.ranks, n, topo.bottleneck(), gamma, SEGMENT_BYTES)
    return ring_reduce_scatter(topo.ranks, n, topo.bottleneck(topo.nic_rings), gamma)
