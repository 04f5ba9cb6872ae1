"""The engine's ring on buffers with fewer elements than ranks, replayed message by message
(engine.projection.sparse_ring), against hand examples worked out step by step, and against the closed
form where no shard is empty."""

from __future__ import annotations

import pytest

from engine.projection.collective_times import Link, Topology, ring_reduce_scatter
from engine.projection.sparse_ring import sparse_all_gather, sparse_all_reduce, sparse_reduce_scatter

FAST, SLOW = Link(20e-6, 1 / 5e9), Link(1e-3, 1 / 0.25e9)
GAMMA = 1 / 2e9


def one_value(link: Link) -> float:
    return link.p2p(8)  # one fp64 value


def test_one_value_across_two_nodes_pays_the_slow_link_only_where_it_crosses():
    """4 ranks as 2 nodes of 2: links 0→1 and 2→3 inside a node, 1→2 and 3→0 across. One value (shard 0;
    shards 1-3 empty). Reduce-scatter: rank 1 sends it across (ends then), rank 2 receives and sends it on
    inside, rank 3 receives and sends across, rank 0 receives it last. All-gather: from rank 0, inside,
    across, inside. The closed form charges all six steps the slow link."""
    topo = Topology(4, 2, FAST, SLOW, 0.0)
    f, s = one_value(FAST), one_value(SLOW)
    scattered = sparse_reduce_scatter(topo, 1, 8, 0.0)
    assert scattered == pytest.approx([2 * s + f, s, s + f, 2 * s + f])
    gathered = sparse_all_gather(topo, 1, 8, scattered)
    rs = 2 * s + f
    assert gathered == pytest.approx([rs + f, rs + f + s, rs + f + s + f, rs + f + s + f])
    assert sparse_all_reduce(topo, 1, 8) == pytest.approx(3 * s + 3 * f)


def test_three_values_on_four_ranks_of_one_node():
    """Shards [1, 1, 1, 0]: every step moves one whole value, and the rank that finishes the
    reduce-scatter last reduces one value in each of its 3 steps: 6 (α + 8β) + 3 · 8γ."""
    topo = Topology(4, 4, FAST, FAST, GAMMA)
    assert sparse_all_reduce(topo, 3, 8) == pytest.approx(6 * one_value(FAST) + 3 * 8 * GAMMA)


def test_a_chain_through_a_long_ring():
    """One value on 64 ranks of one node: 63 hops there and 63 back, each one message."""
    topo = Topology(64, 64, FAST, FAST, 0.0)
    assert sparse_all_reduce(topo, 1, 8) == pytest.approx(126 * one_value(FAST))


@pytest.mark.parametrize("elements", [4, 8, 12])
def test_whole_shards_give_the_closed_form(elements):
    """No shard empty, all equal: on one node the replay's reduce-scatter is the published
    (p−1)(α + n/p·β) + (p−1)/p·n·γ. Across two, every step waits for the slow link, and the ranks that
    send on it reduce what they received while their send is still held, so only the last step's
    reduction, on the rank that receives on the slow link, is not hidden: (p−1)(α + n/p·β)_slow + n/p·γ."""
    n = 4 * elements  # fp32
    one_node = Topology(4, 4, FAST, FAST, GAMMA)
    assert max(sparse_reduce_scatter(one_node, elements, 4, GAMMA)) == pytest.approx(
        ring_reduce_scatter(4, n, FAST, GAMMA))
    two_nodes = Topology(4, 2, FAST, SLOW, GAMMA)
    assert max(sparse_reduce_scatter(two_nodes, elements, 4, GAMMA)) == pytest.approx(
        ring_reduce_scatter(4, n, SLOW, 0.0) + n / 4 * GAMMA)
