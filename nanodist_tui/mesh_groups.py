"""The device mesh's process groups as the mesh pane lists them: each kind's groups, the link they use (inside
one node of parallel.ranks_per_node ranks, or across nodes), what they are for, and the bytes the traffic
meter booked under each group's name in the last step. Besides the mesh's groups ("tp0", "dpcp1": their
names in engine.parallel.mesh), the meter books traffic under its own communicators: the whole world, and
the node grid's "node<m>" and "cross<j>" (engine.comm.group) that hierarchical collectives use. Pure data
(no Textual)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from engine.parallel.mesh import GROUP_KINDS, Mesh

# the meter's own communicators: name (without its number) -> what its ranks are
METER_GROUPS = {"world": "every rank", "node": "the ranks of one node (hierarchical, inside the node)",
                "cross": "one rank of each node (hierarchical, across nodes)"}


def meter_members(name: str, world_size: int, ranks_per_node: int) -> list[int] | None:
    """The ranks of one of the meter's own communicators ("world", "node<m>", "cross<j>"); None for a name
    it does not know, or a node or column outside the world."""
    if name == "world":
        return list(range(world_size))
    per = ranks_per_node if ranks_per_node > 0 else world_size
    prefix, number = _numbered(name)
    if prefix == "node" and 0 <= number < world_size // per:
        return list(range(number * per, (number + 1) * per))
    if prefix == "cross" and 0 <= number < per:
        return list(range(number, world_size, per))
    return None


def _numbered(name: str) -> tuple[str, int]:
    """"node12" -> ("node", 12); a name without a number -> (name, -1)."""
    stem = name.rstrip("0123456789")
    return stem, int(name[len(stem):]) if name != stem else -1


def link_of(groups: list[list[int]], ranks_per_node: int) -> str:
    """Which link a kind of group uses: "intra-node" when each group sits inside one node of
    parallel.ranks_per_node ranks (0: every rank on one node), "inter-node" when each spans nodes, "mixed"
    when some do and some do not; "-" for groups of one rank (they send nothing)."""
    sending = [g for g in groups if len(g) > 1]
    if not sending:
        return "-"
    if ranks_per_node <= 0:
        return "intra-node"
    spanning = [len({r // ranks_per_node for r in g}) > 1 for g in sending]
    return "inter-node" if all(spanning) else "mixed" if any(spanning) else "intra-node"


@dataclass(frozen=True)
class GroupKind:
    """One kind of group as the mesh pane lists it: its groups (ranks each), what they are for, the link they
    use, and the bytes per step booked under each group's name (all its ranks' sends)."""
    kind: str
    groups: list[list[int]]
    what: str
    link: str
    sent: dict[str, int]  # group name -> bytes in the last step; only groups that sent
    same_as: str = ""  # an earlier kind with exactly these groups ("dp" for dpcp when cp is 1)

    @property
    def size(self) -> int:
        return len(self.groups[0])


def group_kinds(mesh: Mesh, ranks_per_node: int, sent: dict[str, int]) -> tuple[list[GroupKind], list[str]]:
    """(the mesh's kinds whose groups hold more than one rank, and the meter's own communicators that sent
    bytes, in GROUP_KINDS order then world, node, cross; the kinds of one-rank groups). `sent`: bytes per
    group name in the last step (traffic.bytes_by_group)."""
    listed: list[GroupKind] = []
    alone: list[str] = []
    for kind, what in GROUP_KINDS.items():
        groups = mesh.groups(kind)
        if len(groups[0]) == 1:
            alone.append(kind)
            continue
        names = [f"{kind}{i}" for i in range(len(groups))]
        same = next((k.kind for k in listed if k.groups == groups), "")
        listed.append(GroupKind(kind, groups, what, link_of(groups, ranks_per_node),
                                {n: sent[n] for n in names if sent.get(n)}, same))
    for meter in meter_kinds(mesh.world_size, ranks_per_node, {n: b for n, b in sent.items() if b}):
        same = next((k.kind for k in listed if k.groups == meter.groups), "")
        listed.append(dataclasses.replace(meter, same_as=same))
    return listed, alone


def meter_kinds(world_size: int, ranks_per_node: int, sent: dict[str, int]) -> list[GroupKind]:
    """The meter's own communicators that sent bytes, by kind (world, node, cross), groups in number order."""
    by_kind: dict[str, dict[str, list[int]]] = {}
    for name in sorted(sent, key=_numbered):
        if (members := meter_members(name, world_size, ranks_per_node)) is not None:
            by_kind.setdefault(_numbered(name)[0], {})[name] = members
    return [GroupKind(kind, list(named.values()), what, link_of(list(named.values()), ranks_per_node),
                      {n: sent[n] for n in named})
            for kind, what in METER_GROUPS.items() if (named := by_kind.get(kind))]


def unknown_groups(mesh: Mesh, ranks_per_node: int, sent: dict[str, int]) -> dict[str, int]:
    """Bytes booked under names that are neither the mesh's groups nor the meter's own communicators (a
    recording from another release): listed by name, never dropped."""
    known = {f"{k}{i}" for k in GROUP_KINDS for i in range(len(mesh.groups(k)))}
    return {n: b for n, b in sorted(sent.items(), key=lambda item: _numbered(item[0]))
            if b and n not in known and meter_members(n, mesh.world_size, ranks_per_node) is None}


def nodes_text(world_size: int, per: int) -> str:
    """Where the node boundaries fall: "nodes (parallel.ranks_per_node = 4): 0-3, 4-7"."""
    if per <= 0 or per >= world_size:
        return f"one node (parallel.ranks_per_node = {per}): every link intra-node"
    spans = [f"{m * per}-{(m + 1) * per - 1}" for m in range(world_size // per)]
    if len(spans) > 4:
        spans = [*spans[:2], "...", spans[-1]]
    return f"nodes (parallel.ranks_per_node = {per}): {', '.join(spans)}"
