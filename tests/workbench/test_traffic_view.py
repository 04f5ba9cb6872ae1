"""The traffic pane's figures from Traffic and RankStats events: per link and phase, the ring bound,
NCCL-tests' algbw and busbw (checked against the definitions written out here), the straggler and the slow
link, and the ring as drawn (every link's label, ASCII only when asked)."""

from __future__ import annotations

import pytest

from engine.events import RankStats, Traffic
from nanodist_tui.traffic import (
    Link,
    allreduce_bandwidth,
    phase_bandwidths,
    rank_traffic,
    ring_bound,
    slow_links,
    step_splits,
    stragglers,
)
from nanodist_tui.widgets.glyphs import ASCII, UNICODE
from nanodist_tui.widgets.ring_diagram import draw_ring


def traffic(rank: int, world: int, rs: tuple[int, float], ag: tuple[int, float]) -> Traffic:
    dst = (rank + 1) % world
    return Traffic(step=7, rank=rank, links=[
        {"src": rank, "dst": dst, "phase": "reduce-scatter", "bytes": rs[0], "seconds": rs[1]},
        {"src": rank, "dst": dst, "phase": "all-gather", "bytes": ag[0], "seconds": ag[1]},
        {"src": rank, "dst": (rank + 2) % world, "phase": "barrier", "bytes": 1, "seconds": 1e-5}])


def test_a_ranks_links_and_phases_add_up():
    t = rank_traffic(traffic(1, 4, (3_000, 0.003), (3_000, 0.001)))
    assert (t.rank, t.step) == (1, 7)
    assert t.links[(1, 2)].bytes == 6_000
    assert t.links[(1, 2)].phases == {"reduce-scatter": 3_000, "all-gather": 3_000}
    assert t.links[(1, 3)].bytes == 1
    assert list(t.phases) == ["reduce-scatter", "all-gather", "barrier"]  # in the order a step runs them
    assert t.sync_bytes == 6_000 and t.bytes == 6_001
    assert t.seconds == pytest.approx(0.00401)


@pytest.mark.parametrize("world, stage, factor", [(2, 0, 2), (4, 1, 2), (4, 2, 2), (4, 3, 3), (8, 3, 3)])
def test_the_ring_bound_is_k_n_minus_1_over_n_times_s(world, stage, factor):
    s = 1_000_000
    assert ring_bound(s, world, stage) == pytest.approx(factor * (world - 1) / world * s)
    assert ring_bound(s, 1, stage) == 0


def test_bandwidths_follow_the_nccl_tests_definitions():
    world = 4
    size = 4_000_000  # the all-reduced buffer S; each ring half sends (N-1)/N * S per rank
    half = size * (world - 1) // world
    t = rank_traffic(traffic(0, world, (half, 0.002), (half, 0.001)))
    rows = {row.phase: row for row in phase_bandwidths(t, world)}
    assert set(rows) == {"reduce-scatter", "all-gather"}  # a barrier is no collective of a buffer
    # reduce-scatter of S in 2 ms: algbw = S/t, busbw = algbw * (N-1)/N
    assert rows["reduce-scatter"].algbw == pytest.approx(size / 0.002)
    assert rows["reduce-scatter"].busbw == pytest.approx(size / 0.002 * (world - 1) / world)
    assert rows["all-gather"].busbw == pytest.approx(size / 0.001 * (world - 1) / world)
    # the whole all-reduce of S in 3 ms: busbw = algbw * 2(N-1)/N
    algbw, busbw = allreduce_bandwidth(t, world)
    assert algbw == pytest.approx(size / 0.003)
    assert busbw == pytest.approx(size / 0.003 * 2 * (world - 1) / world)


def test_the_straggler_and_the_slow_link_are_picked_out():
    stats = {r: RankStats(step=7, rank=r, step_time_s=0.1, comm_wait_s=0.05, bytes_sent=0) for r in range(4)}
    stats[2] = RankStats(step=7, rank=2, step_time_s=0.1, comm_wait_s=0.0, bytes_sent=0)  # computes 0.1 s
    splits = step_splits(stats, {})
    assert [s.compute_s for s in splits] == [0.05, 0.05, 0.1, 0.05]
    assert stragglers(splits) == {2}
    assert stragglers(step_splits({r: stats[r] for r in (0, 1)}, {})) == set()  # equal ranks: none
    links = [Link(r, (r + 1) % 4, 1_000_000, 0.001) for r in range(4)]
    links[3].seconds = 0.01
    assert slow_links(links) == {(3, 0)}


@pytest.mark.parametrize("world", [2, 3, 4, 5, 8])
def test_the_ring_shows_every_link_with_its_bytes_and_rate(world):
    links = {(r, (r + 1) % world): Link(r, (r + 1) % world, 2_500_000 + r, 0.001 * (r + 1))
             for r in range(world)}
    lines, with_bytes = draw_ring(world, links, 200, UNICODE)
    text = "\n".join(line.plain for line in lines)
    assert with_bytes
    for r in range(world):
        assert f"[{r}]" in text
        rate = (2_500_000 + r) / (0.001 * (r + 1))
        shown = f"{rate / 1e9:.2f} GB/s" if rate >= 1e9 else f"{rate / 1e6:.1f} MB/s"  # GB/s = 10^9 B/s
        assert f"{2.5:.1f} MB" in text and shown in text


def test_a_narrow_ring_drops_equal_bytes_then_gives_up():
    links = {(r, (r + 1) % 8): Link(r, (r + 1) % 8, 1_000, 0.001) for r in range(8)}
    lines, with_bytes = draw_ring(8, links, 76, ASCII)
    assert not with_bytes and all(len(line.plain) <= 76 for line in lines)
    assert all(ch.isascii() for line in lines for ch in line.plain)  # the ASCII fallback
    assert draw_ring(8, links, 30, ASCII) is None  # the pane lists the links instead


def test_which_ran_where_sums_each_groups_algorithms_over_the_ranks():
    """Hierarchical on 2 nodes x 2: each rank's in-node steps, and its inter-node step booked under the
    algorithm that ran there (auto's choice) — the pane lists what every rank sent by group and algorithm."""
    from nanodist_tui.traffic import which_ran_where

    def hierarchical(rank: int) -> Traffic:
        node, local = divmod(rank, 2)
        return Traffic(step=3, rank=rank, links=[
            {"src": rank, "dst": node * 2 + 1 - local, "phase": "reduce-scatter", "group": f"node{node}",
             "algorithm": "hierarchical", "bytes": 500, "seconds": 1e-4},
            {"src": rank, "dst": (rank + 2) % 4, "phase": "reduce-scatter", "group": f"cross{local}",
             "algorithm": "tree", "bytes": 250, "seconds": 1e-3},
            {"src": rank, "dst": node * 2 + 1 - local, "phase": "all-gather", "group": f"node{node}",
             "algorithm": "hierarchical", "bytes": 500, "seconds": 1e-4}])
    ranks = [rank_traffic(hierarchical(r)) for r in range(4)]
    assert ranks[0].links[(0, 2)].algorithms == {("cross0", "tree"): 250}
    assert which_ran_where(ranks) == {"node0": {"hierarchical": 2000}, "node1": {"hierarchical": 2000},
                                      "cross0": {"tree": 500}, "cross1": {"tree": 500}}
    old = rank_traffic(traffic(0, 4, (3_000, 0.003), (3_000, 0.001)))  # a recording without the fields
    assert which_ran_where([old]) == {}


@pytest.mark.parametrize("degrees, named", [({"pipeline": 2}, "pp 2"),
                                            ({"tensor": 2, "pipeline": 2}, "tp 2 x pp 2")])
def test_a_split_model_gets_no_data_parallel_ring_bound(monkeypatch, degrees, named):
    """2(N-1)/N·S holds for data parallelism alone: under tensor or pipeline parallelism each rank reduces
    its own shard or stage over a smaller group, so the pane says so instead of a bound that does not
    apply."""
    from nanodist_tui.run_info import RunInfo
    from nanodist_tui.widgets import traffic_pane
    from nanodist_tui.widgets.traffic_pane import TrafficPane
    monkeypatch.setattr(traffic_pane, "glyphs_of", lambda widget: UNICODE)  # drawn outside an app
    world = 2 * max(degrees.values()) if len(degrees) == 1 else 8
    pane = TrafficPane(RunInfo(preset="t", world_size=world, n_params=1000, **degrees))
    pane.traffic = {r: rank_traffic(traffic(r, world, (3_000, 0.003), (3_000, 0.001))) for r in range(world)}
    text = pane.render_traffic(200).plain
    assert f"no ring bound for a split model ({named})" in text and "vs ring bound" not in text
    plain = TrafficPane(RunInfo(preset="t", world_size=world, n_params=1000))
    plain.traffic = pane.traffic
    assert "vs ring bound" in plain.render_traffic(200).plain
