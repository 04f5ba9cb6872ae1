"""The device mesh: every rank's place on the grid of parallelism axes, and the process groups that are
the grid's slices.

    axis  degree                its group holds the ranks that ...
    tp    parallel.tensor       split each layer's weight matrices (the most traffic: innermost)
    cp    parallel.context      split each sequence
    dp    what remains          hold the same weights and see different data
    pp    parallel.pipeline     hold successive stages of the layers
    ep    parallel.expert       split a mixture of experts' experts (carved out of DP x CP, below)

The grid. tp, cp, dp and pp multiply to the world: dp = world_size / (tp * cp * pp). `order` names the
axes innermost first, joined by "-" (Megatron's RankGenerator spelling): the innermost axis varies
fastest with the rank, so its groups are adjacent ranks (one node, the fastest links). A rank is the
mixed-radix number of its coordinates: rank = sum of coord[a] * stride[a], the innermost axis's stride 1,
each next axis's stride the product of the degrees inside it. The default "tp-cp-ep-dp-pp" is Megatron's
(picotron's and torchtitan's grids agree): tensor partners adjacent, pipeline stages farthest apart.

Expert parallelism does not multiply the world, as in Megatron (its expert RankGenerator) and torchtitan
(dp_shard * cp % ep == 0): the DP x CP ranks of one (pp, tp) cell, which hold the same dense weights,
are regrouped as ep x edp. In that group's members in rank order, an EP group is `ep` consecutive members
when ep comes before dp in `order` (the default), every (dp*cp/ep)-th member when it comes after; edp
groups are the rest of the split (ranks holding the same experts: the experts' gradient reduce). Where
ep stands against tp, cp or pp changes nothing. Experts keep the tensor split of their (pp, tp) cell.

Group kinds (GROUP_KINDS, each with what it is for): one per axis, plus "dpcp" (the ranks that differ
only in dp and cp: they hold the same weights, so the gradient reduce and the loss average go over it)
and "edp". A kind's groups are numbered by their lowest rank, and a group is named kind + number: "tp0",
"dp1", "dpcp0", as the traffic meter shows them. A degree of 1 makes one-rank groups, built all the same,
so code can use every group whatever the layout.

`Mesh` is a pure description (no communicator): the CLI, the projection and the workbench read it.
`build_groups(mesh, comm)` makes this rank's Group of every kind (local, as engine.comm.group.Group is).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, NamedTuple

from engine.comm.group import Group

if TYPE_CHECKING:
    from engine.comm.base import Communicator

# axis -> the [parallel] key of its degree ("dp" has none: it is what remains of the world)
AXES: dict[str, str] = {"tp": "tensor", "cp": "context", "ep": "expert", "dp": "data", "pp": "pipeline"}
DEFAULT_ORDER = "tp-cp-ep-dp-pp"
DENSE_AXES = ("tp", "cp", "dp", "pp")  # the axes that multiply to the world
# group kind -> what its ranks share, or do together
GROUP_KINDS: dict[str, str] = {
    "tp": "split each layer's weights", "cp": "split each sequence", "dp": "same weights, other data",
    "pp": "successive stages", "ep": "split the experts (all-to-all)",
    "dpcp": "same weights: the gradient reduce and the loss average",
    "edp": "same experts: their gradient reduce",
}


class Coords(NamedTuple):
    """A rank's place on each axis (ep: its index in its EP group)."""
    dp: int
    pp: int
    cp: int
    tp: int
    ep: int


def parse_order(text: str) -> tuple[str, ...]:
    """"tp-cp-ep-dp-pp" -> ("tp", "cp", "ep", "dp", "pp"); ValueError saying what is wrong."""
    names = tuple(part.strip() for part in str(text).split("-"))
    if unknown := [n for n in names if n not in AXES]:
        raise ValueError(f"{unknown[0]!r} is not an axis (the axes: {', '.join(AXES)})")
    if twice := sorted({n for n in names if names.count(n) > 1}):
        raise ValueError(f"it names {twice[0]} twice")
    if missing := [a for a in AXES if a not in names]:
        raise ValueError(f"it leaves out {', '.join(missing)}")
    return names


@dataclass(frozen=True)
class Mesh:
    """`world_size` ranks as tp x cp x dp x pp (dp what remains), ep carved out of DP x CP, laid out by
    `order`; ValueError for a layout that cannot be."""
    world_size: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    order: str = DEFAULT_ORDER
    axes: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "axes", parse_order(self.order))
        degrees = (self.world_size, self.tp, self.pp, self.cp, self.ep)
        if min(degrees) < 1:
            raise ValueError(f"world size and degrees must be >= 1, got {degrees}")
        if self.world_size % (self.tp * self.pp * self.cp):
            raise ValueError(f"world size {self.world_size} is not a multiple of tp {self.tp} x pp {self.pp} "
                             f"x cp {self.cp}")
        if (self.dp * self.cp) % self.ep:
            raise ValueError(f"ep {self.ep} does not divide dp {self.dp} x cp {self.cp}")

    @classmethod
    def of(cls, parallel: Any) -> Mesh:
        """The mesh of a [parallel] section (engine.config.ParallelConfig, or anything with its fields)."""
        return cls(parallel.world_size, parallel.tensor, parallel.pipeline, parallel.context,
                   parallel.expert, parallel.order)

    @property
    def dp(self) -> int:
        return self.world_size // (self.tp * self.pp * self.cp)

    def degree(self, axis: str) -> int:
        """An axis's degree ("tp", "cp", "dp", "pp", "ep") or a group kind's size ("dpcp", "edp")."""
        sizes = {"tp": self.tp, "cp": self.cp, "dp": self.dp, "pp": self.pp, "ep": self.ep,
                 "dpcp": self.dp * self.cp, "edp": self.dp * self.cp // self.ep}
        if axis not in sizes:
            raise ValueError(f"{axis!r} is neither an axis nor a group kind ({', '.join(GROUP_KINDS)})")
        return sizes[axis]

    @cached_property
    def strides(self) -> dict[str, int]:
        """Rank distance between neighbours on each dense axis."""
        out, stride = {}, 1
        for axis in (a for a in self.axes if a in DENSE_AXES):
            out[axis], stride = stride, stride * self.degree(axis)
        return out

    @property
    def ep_inner(self) -> bool:
        """EP groups are consecutive members of the DP x CP group (ep before dp in the order)."""
        return self.axes.index("ep") < self.axes.index("dp")

    def rank_of(self, dp: int = 0, pp: int = 0, cp: int = 0, tp: int = 0) -> int:
        """The rank at these coordinates."""
        coords = {"dp": dp, "pp": pp, "cp": cp, "tp": tp}
        if bad := [a for a, c in coords.items() if not 0 <= c < self.degree(a)]:
            raise ValueError(f"{bad[0]} coordinate {coords[bad[0]]} outside 0..{self.degree(bad[0]) - 1}")
        return sum(c * self.strides[a] for a, c in coords.items())

    def coords(self, rank: int) -> Coords:
        """Where `rank` sits on every axis."""
        dense = {a: rank // self.strides[a] % self.degree(a) for a in DENSE_AXES}
        position = self.members("dpcp", rank).index(rank)
        ep = position % self.ep if self.ep_inner else position // self.degree("edp")
        return Coords(ep=ep, **dense)

    def members(self, kind: str, rank: int) -> list[int]:
        """The ranks of `rank`'s group of `kind` (one of GROUP_KINDS), in group order (rank order)."""
        groups, number = self._table(kind)
        return list(groups[number[self._checked(rank)]])

    def groups(self, kind: str) -> list[list[int]]:
        """Every group of `kind`, numbered (listed) by lowest rank: group i is named f"{kind}{i}"."""
        return [list(g) for g in self._table(kind)[0]]

    def group_name(self, kind: str, rank: int) -> str:
        """The name of `rank`'s group of `kind`, as the traffic meter shows it: "tp0", "dpcp1"."""
        return f"{kind}{self._table(kind)[1][self._checked(rank)]}"

    def _checked(self, rank: int) -> int:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside a world of {self.world_size}")
        return rank

    def _table(self, kind: str) -> tuple[list[list[int]], list[int]]:
        if kind not in GROUP_KINDS:
            raise ValueError(f"{kind!r} is not a group kind (the kinds: {', '.join(GROUP_KINDS)})")
        return self._tables[kind]

    @cached_property
    def _tables(self) -> dict[str, tuple[list[list[int]], list[int]]]:
        """kind -> (its groups by lowest rank, each rank's group number): each group worked out once."""
        tables = {}
        for kind in GROUP_KINDS:
            groups: list[list[int]] = []
            number = [-1] * self.world_size
            for rank in range(self.world_size):
                if number[rank] < 0:  # the lowest rank of a group not met yet
                    for member in (group := self._group(kind, rank)):
                        number[member] = len(groups)
                    groups.append(group)
            tables[kind] = (groups, number)
        return tables

    def _group(self, kind: str, rank: int) -> list[int]:
        if kind in DENSE_AXES:
            stride = self.strides[kind]
            base = rank - rank // stride % self.degree(kind) * stride
            return [base + i * stride for i in range(self.degree(kind))]
        cell = sorted(r for d in self._group("dp", rank) for r in self._group("cp", d))
        if kind == "dpcp":
            return cell
        position, step = cell.index(rank), self.ep if self.ep_inner else self.degree("edp")
        strided = (kind == "edp") == self.ep_inner  # which of the two splits takes every step-th member
        return cell[position % step::step] if strided else cell[position // step * step:][:step]

    def describe(self) -> dict[str, Any]:
        """The whole layout as plain JSON data: degrees, order, every rank's coordinates and groups, and
        every group's ranks."""
        return {
            "world_size": self.world_size, "order": "-".join(self.axes),
            "degrees": {a: self.degree(a) for a in AXES},
            "ranks": [{"rank": r, "coords": self.coords(r)._asdict(),
                       "groups": {k: self.group_name(k, r) for k in GROUP_KINDS}}
                      for r in range(self.world_size)],
            "groups": {k: {f"{k}{i}": g for i, g in enumerate(self.groups(k))} for k in GROUP_KINDS},
        }


@dataclass(frozen=True)
class MeshGroups:
    """One rank's group of every kind, over the job's world communicator."""
    mesh: Mesh
    tp: Group
    cp: Group
    dp: Group
    pp: Group
    ep: Group
    dpcp: Group
    edp: Group

    def of(self, kind: str) -> Group:
        return getattr(self, kind)


def build_groups(mesh: Mesh, comm: Communicator) -> MeshGroups:
    """`comm`'s rank's groups of every kind (no communication: every rank builds its own)."""
    if comm.world_size != mesh.world_size:
        raise ValueError(f"a mesh of {mesh.world_size} ranks over a communicator of {comm.world_size}")
    made = {k: Group(comm, mesh.members(k, comm.rank), mesh.group_name(k, comm.rank)) for k in GROUP_KINDS}
    return MeshGroups(mesh, **made)

