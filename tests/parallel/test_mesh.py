"""The device mesh (engine/parallel/mesh.py): coordinates and ranks map both ways, every kind of group
partitions the world and varies only its own axes, TP is innermost by default, EP is carved out of DP x CP,
and the groups it builds over a real communicator carry their names to the traffic meter.

The layouts written out by hand below are the expectations; the properties run on many layouts."""

from __future__ import annotations

import itertools
import json
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.comm import TrafficMeter, all_reduce, run_ranks
from engine.parallel.mesh import AXES, DEFAULT_ORDER, GROUP_KINDS, Mesh, build_groups, parse_order

DENSE = ("tp", "cp", "dp", "pp")


# ----------------------------------------------------------------------------- layouts written out by hand

def test_world_8_as_dp2_pp2_tp2():
    """rank = tp + 2 dp + 4 pp (tp innermost, pp outermost)."""
    mesh = Mesh(8, tp=2, pp=2)
    assert mesh.dp == 2 and mesh.order == DEFAULT_ORDER == "tp-cp-ep-dp-pp"
    assert mesh.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert mesh.groups("dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert mesh.groups("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert mesh.groups("cp") == [[0], [1], [2], [3], [4], [5], [6], [7]]
    assert mesh.groups("dpcp") == [[0, 2], [1, 3], [4, 6], [5, 7]]  # cp 1: the data-parallel groups
    assert mesh.groups("ep") == [[r] for r in range(8)]
    assert mesh.groups("edp") == mesh.groups("dpcp")
    # (dp, pp, cp, tp, ep) of ranks 0..7
    assert [tuple(mesh.coords(r)) for r in range(8)] == [
        (0, 0, 0, 0, 0), (0, 0, 0, 1, 0), (1, 0, 0, 0, 0), (1, 0, 0, 1, 0),
        (0, 1, 0, 0, 0), (0, 1, 0, 1, 0), (1, 1, 0, 0, 0), (1, 1, 0, 1, 0)]
    names = {kind: [mesh.group_name(kind, r) for r in range(8)] for kind in ("dp", "tp")}
    assert names["dp"] == ["dp0", "dp1", "dp0", "dp1", "dp2", "dp3", "dp2", "dp3"]
    assert names["tp"] == ["tp0", "tp0", "tp1", "tp1", "tp2", "tp2", "tp3", "tp3"]
    assert mesh.members("pp", 6) == [2, 6]


def test_world_16_as_dp4_cp2_tp2_with_ep4():
    """rank = tp + 2 cp + 4 dp. DP x CP of a tensor rank: the even or the odd ranks; EP takes 4 of them in a
    row (Megatron's expert grid tp-ep-edp: rank = tp + 2 ep + 8 edp), the expert-data groups the rest."""
    mesh = Mesh(16, tp=2, cp=2, ep=4)
    assert mesh.dp == 4
    assert mesh.groups("cp") == [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11], [12, 14], [13, 15]]
    assert mesh.groups("dp") == [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]]
    assert mesh.groups("dpcp") == [[0, 2, 4, 6, 8, 10, 12, 14], [1, 3, 5, 7, 9, 11, 13, 15]]
    assert mesh.groups("ep") == [[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], [9, 11, 13, 15]]
    assert mesh.groups("edp") == [[0, 8], [1, 9], [2, 10], [3, 11], [4, 12], [5, 13], [6, 14], [7, 15]]
    assert [mesh.coords(r).ep for r in (0, 2, 4, 6, 8, 10, 12, 14)] == [0, 1, 2, 3, 0, 1, 2, 3]


def test_ep_after_dp_takes_every_other_member():
    mesh = Mesh(8, ep=2, order="tp-cp-dp-ep-pp")
    assert mesh.groups("ep") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert mesh.groups("edp") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [mesh.coords(r).ep for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert Mesh(8, ep=2).groups("ep") == [[0, 1], [2, 3], [4, 5], [6, 7]]  # the default: neighbours


def test_another_order_moves_the_neighbours():
    """dp innermost, then tp: rank = dp + 2 tp (+ 4 pp)."""
    mesh = Mesh(8, tp=2, pp=2, order="dp-tp-cp-ep-pp")
    assert mesh.groups("dp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert mesh.groups("tp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert mesh.groups("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    mesh = Mesh(8, tp=2, pp=2, order="pp-dp-ep-cp-tp")  # pp innermost, tp outermost: rank = pp + 2 dp + 4 tp
    assert mesh.groups("pp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert mesh.groups("tp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert mesh.rank_of(dp=1, pp=1, tp=1) == 7 and mesh.rank_of(tp=1) == 4


def test_one_rank_and_pure_data_parallelism():
    assert Mesh(1).describe()["groups"]["tp"] == {"tp0": [0]}
    mesh = Mesh(4)
    assert mesh.dp == 4 and mesh.groups("dp") == [[0, 1, 2, 3]] == mesh.groups("dpcp")
    assert [mesh.coords(r).dp for r in range(4)] == [0, 1, 2, 3]


# ----------------------------------------------------------------------------- properties over many layouts

@st.composite
def layouts(draw):
    tp, pp, cp, dp = (draw(st.sampled_from([1, 2, 3, 4])) for _ in range(4))
    ep = draw(st.sampled_from([d for d in range(1, dp * cp + 1) if dp * cp % d == 0]))
    order = "-".join(draw(st.permutations(list(AXES))))
    return Mesh(tp * pp * cp * dp, tp=tp, pp=pp, cp=cp, ep=ep, order=order)


@settings(max_examples=150, deadline=None)
@given(layouts())
def test_coordinates_and_ranks_map_both_ways(mesh):
    seen = set()
    for rank in range(mesh.world_size):
        c = mesh.coords(rank)
        assert mesh.rank_of(dp=c.dp, pp=c.pp, cp=c.cp, tp=c.tp) == rank
        assert all(0 <= getattr(c, a) < mesh.degree(a) for a in (*DENSE, "ep"))
        seen.add((c.dp, c.pp, c.cp, c.tp))
    assert len(seen) == mesh.world_size
    for dp, pp, cp, tp in itertools.product(*(range(mesh.degree(a)) for a in ("dp", "pp", "cp", "tp"))):
        assert mesh.coords(mesh.rank_of(dp=dp, pp=pp, cp=cp, tp=tp))[:4] == (dp, pp, cp, tp)


@settings(max_examples=150, deadline=None)
@given(layouts())
def test_every_kind_of_group_partitions_the_world(mesh):
    for kind in GROUP_KINDS:
        groups = mesh.groups(kind)
        assert sorted(r for g in groups for r in g) == list(range(mesh.world_size)), kind
        assert all(len(g) == mesh.degree(kind) for g in groups), kind
        assert [g[0] for g in groups] == sorted(min(g) for g in groups)  # numbered by lowest rank
        for number, group in enumerate(groups):
            assert group == sorted(group)
            for rank in group:
                assert mesh.members(kind, rank) == group and mesh.group_name(kind, rank) == f"{kind}{number}"


@settings(max_examples=150, deadline=None)
@given(layouts())
def test_a_group_varies_only_its_own_axes(mesh):
    for rank in range(mesh.world_size):
        me = mesh.coords(rank)._asdict()
        for kind, free in [*((a, {a}) for a in DENSE), ("dpcp", {"dp", "cp"})]:
            members = [mesh.coords(r)._asdict() for r in mesh.members(kind, rank)]
            fixed = [a for a in DENSE if a not in free]
            assert all(all(m[a] == me[a] for a in fixed) for m in members), (kind, rank)
            # every combination of the free axes' coordinates, once
            assert len({tuple(m[a] for a in sorted(free)) for m in members}) == len(members)


@settings(max_examples=150, deadline=None)
@given(layouts())
def test_expert_groups_split_dp_x_cp(mesh):
    for rank in range(mesh.world_size):
        cell = set(mesh.members("dpcp", rank))
        ep, edp = mesh.members("ep", rank), mesh.members("edp", rank)
        assert set(ep) <= cell and set(edp) <= cell and set(ep) & set(edp) == {rank}
        assert len(ep) * len(edp) == len(cell)
        assert [mesh.coords(r).ep for r in ep] == list(range(mesh.ep))  # an EP group holds each expert shard
        assert {mesh.coords(r).ep for r in edp} == {mesh.coords(rank).ep}  # the same experts
        consecutive = sorted(cell)
        position = consecutive.index(rank)
        if mesh.order.index("ep") < mesh.order.index("dp"):
            start = position // mesh.ep * mesh.ep
            assert ep == consecutive[start:start + mesh.ep]


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 3]), st.sampled_from([1, 2]))
def test_tp_innermost_makes_tp_groups_consecutive_ranks(tp, pp, dp):
    mesh = Mesh(tp * pp * dp, tp=tp, pp=pp)
    assert mesh.groups("tp") == [list(range(start, start + tp)) for start in range(0, mesh.world_size, tp)]
    assert mesh.groups("pp") == [list(range(start, mesh.world_size, tp * dp)) for start in range(tp * dp)]


def test_the_description_is_plain_json():
    mesh = Mesh(8, tp=2, pp=2)
    d = json.loads(json.dumps(mesh.describe()))
    assert d["degrees"] == {"tp": 2, "cp": 1, "ep": 1, "dp": 2, "pp": 2} and d["order"] == "tp-cp-ep-dp-pp"
    assert d["ranks"][5] == {"rank": 5, "coords": {"dp": 0, "pp": 1, "cp": 0, "tp": 1, "ep": 0},
                             "groups": {"tp": "tp2", "cp": "cp5", "dp": "dp3", "pp": "pp1", "ep": "ep5",
                                        "dpcp": "dpcp3", "edp": "edp3"}}
    assert d["groups"]["dpcp"] == {"dpcp0": [0, 2], "dpcp1": [1, 3], "dpcp2": [4, 6], "dpcp3": [5, 7]}


def test_a_mesh_of_1024_ranks_describes_itself_quickly():
    import time
    start = time.perf_counter()
    Mesh(1024, tp=8, pp=4, cp=2, ep=4).describe()
    assert time.perf_counter() - start < 5


# ----------------------------------------------------------------------------- impossible layouts

@pytest.mark.parametrize("text, says", [
    ("tp-dp", "leaves out cp, ep, pp"), ("tp-cp-ep-dp-dp", "names dp twice"),
    ("tp-cp-ep-dp-xx", "'xx' is not an axis"), ("", "'' is not an axis"),
])
def test_a_bad_order_says_what_is_wrong(text, says):
    with pytest.raises(ValueError, match=says):
        parse_order(text)


def test_parse_order_accepts_spaces_and_every_permutation():
    assert parse_order(" pp - dp-ep-cp-tp ") == ("pp", "dp", "ep", "cp", "tp")
    assert all(Mesh(1, order="-".join(p)) for p in itertools.permutations(AXES))


@pytest.mark.parametrize("kwargs, says", [
    ({"world_size": 6, "tp": 4}, "not a multiple"), ({"world_size": 8, "ep": 3}, "does not divide"),
    ({"world_size": 8, "tp": 0}, ">= 1"), ({"world_size": 4, "order": "tp"}, "leaves out"),
])
def test_a_mesh_that_cannot_be_is_refused(kwargs, says):
    with pytest.raises(ValueError, match=says):
        Mesh(**kwargs)


def test_lookups_outside_the_mesh_are_refused():
    mesh = Mesh(4, tp=2)
    with pytest.raises(ValueError, match="outside"):
        mesh.rank_of(tp=2)
    with pytest.raises(ValueError, match="outside"):
        mesh.members("tp", 4)
    with pytest.raises(ValueError, match="outside"):
        mesh.group_name("dp", -1)
    with pytest.raises(ValueError, match="outside"):
        mesh.coords(4)
    with pytest.raises(ValueError, match="not a group kind"):
        mesh.groups("xp")


# ----------------------------------------------------------------------------- groups over a communicator

def _reduce_over_every_group(comm, emit, mesh):
    comm.meter = TrafficMeter(comm.rank)
    groups = build_groups(mesh, comm)
    sums = {}
    for kind in GROUP_KINDS:
        group = groups.of(kind)
        x = np.array([float(comm.rank)])
        all_reduce(group, x)
        sums[kind] = (group.name, group.ranks, int(x[0]))
    return {"sums": sums, "groups": sorted({link["group"] for link in comm.meter.snapshot()})}


def test_built_groups_reduce_over_their_members_and_meter_under_their_names():
    mesh = Mesh(8, tp=2, pp=2)
    results = run_ranks(8, "threads", _reduce_over_every_group, (mesh,))
    tp_of = {0: "tp0", 1: "tp0", 2: "tp1", 3: "tp1", 4: "tp2", 5: "tp2", 6: "tp3", 7: "tp3"}
    dp_of = {0: ([0, 2], "dp0"), 1: ([1, 3], "dp1"), 2: ([0, 2], "dp0"), 3: ([1, 3], "dp1"),
             4: ([4, 6], "dp2"), 5: ([5, 7], "dp3"), 6: ([4, 6], "dp2"), 7: ([5, 7], "dp3")}
    for rank, r in enumerate(results):
        name, ranks, total = r["sums"]["tp"]
        assert name == tp_of[rank] and ranks == [rank - rank % 2, rank - rank % 2 + 1] and total == sum(ranks)
        assert r["sums"]["dp"] == (dp_of[rank][1], dp_of[rank][0], sum(dp_of[rank][0]))
        number = dp_of[rank][1][2:]  # cp 1: the DP x CP and expert-data groups are the DP groups
        assert r["sums"]["dpcp"] == ("dpcp" + number, *r["sums"]["dp"][1:])
        assert r["sums"]["edp"] == ("edp" + number, *r["sums"]["dp"][1:])
        assert r["sums"]["pp"][1] == [rank % 4, rank % 4 + 4]
        assert r["sums"]["cp"] == (f"cp{rank}", [rank], rank)  # one rank: nothing sent
        # only groups of more than one rank send, each under its own name
        assert r["groups"] == sorted([tp_of[rank], dp_of[rank][1], "dpcp" + number, f"pp{rank % 4}",
                                      "edp" + number])


def test_groups_need_a_communicator_of_the_mesh_size():
    world_of_2 = SimpleNamespace(rank=0, world_size=2)  # all build_groups reads before it refuses
    with pytest.raises(ValueError, match="a mesh of 8 ranks over a communicator of 2"):
        build_groups(Mesh(8), world_of_2)
