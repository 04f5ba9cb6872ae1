"""The projection's cost formulas against their published forms, written out here by hand (Hockney; Thakur,
Rabenseifner & Gropp 2005 for ring, recursive doubling, Rabenseifner and binary tree; the two-level
hierarchical form), the per-size choice, the FLOPs count against PaLM's 6·Ψ·tokens + 12·L·T·C, the
backward order, the timeline arithmetic, and the nccl-tests fit on a table made from known α and β."""

from __future__ import annotations

import math

import pytest
from projection_helpers import nccl_table

from engine.comm.collectives import SEGMENT_BYTES
from engine.config import from_dict
from engine.projection.collective_times import (
    Link,
    Topology,
    all_reduce_time,
    binary_tree,
    half_collective_time,
    hierarchical,
    rabenseifner,
    recursive_doubling,
    ring_all_gather,
    ring_all_reduce,
    ring_reduce_scatter,
)
from engine.projection.fit import FitError, fit_nccl_all_reduce, fit_ring, line_fit, parse_nccl_tests
from engine.projection.flops import backward_events, model_flops
from engine.projection.timeline import Timeline

A, B, G = 5e-6, 1 / 20e9, 1 / 100e9  # α 5 us, 20 GB/s, reductions at 100 GB/s
LINK = Link(A, B)


@pytest.mark.parametrize("p", [2, 4, 8, 64])
@pytest.mark.parametrize("n", [8, 1 << 20, 3 << 27])
def test_ring_and_friends_equal_their_published_forms(p, n):
    assert ring_all_reduce(p, n, LINK, G) == pytest.approx(2 * (p - 1) * A + 2 * (p - 1) / p * n * B
                                                           + (p - 1) / p * n * G)
    assert ring_reduce_scatter(p, n, LINK, G) == pytest.approx((p - 1) * A + (p - 1) / p * n * B
                                                               + (p - 1) / p * n * G)
    assert ring_all_gather(p, n, LINK) == pytest.approx((p - 1) * A + (p - 1) / p * n * B)
    lg = math.log2(p)
    assert recursive_doubling(p, n, LINK, G) == pytest.approx(lg * (A + n * B + n * G))
    assert rabenseifner(p, n, LINK, G) == pytest.approx(2 * lg * A + 2 * (p - 1) / p * n * B
                                                        + (p - 1) / p * n * G)
    assert binary_tree(p, n, LINK, G) == pytest.approx(2 * lg * (A + n * B) + lg * n * G)


def test_one_rank_costs_nothing():
    for f in (ring_all_reduce, ring_reduce_scatter, recursive_doubling, rabenseifner, binary_tree):
        assert f(1, 1 << 20, LINK, G) == 0.0


@pytest.mark.parametrize("nic, share", [("rank", 1 / 8), ("node", 1.0)])
def test_hierarchical_form(nic, share):
    intra, inter = Link(2e-6, 1 / 300e9), Link(10e-6, 1 / 25e9)
    g, m, n = 8, 16, 1 << 28
    want = (2 * (g - 1) * 2e-6 + 2 * (g - 1) / g * n / 300e9 + 2 * (m - 1) * 10e-6
            + 2 * (m - 1) / m * (n * share) / 25e9)
    assert hierarchical(g, m, n, intra, inter, 0.0, nic) == pytest.approx(want)


def test_hockney_effective_bandwidth():
    n_half = A / B
    assert LINK.half_bandwidth_bytes == pytest.approx(n_half)
    for m in (n_half / 10, n_half, 10 * n_half):
        assert LINK.effective_bandwidth(m) == pytest.approx((1 / B) * m / (m + n_half))
    assert LINK.effective_bandwidth(n_half) == pytest.approx(0.5 / B)


def test_segments_add_one_latency_per_segment():
    p, n = 2, 3 * 2 * SEGMENT_BYTES  # each ring step sends 3 segments
    topo = Topology(p, p, LINK, LINK, 0.0)
    _, seconds = all_reduce_time(topo, n, "ring")
    assert seconds == pytest.approx(2 * (p - 1) * 3 * A + 2 * (p - 1) / p * n * B)


def test_auto_picks_the_fastest_form_at_each_size():
    """Small messages: latency-bound, so the log-p algorithms win; large ones: bandwidth-bound, the ring."""
    topo = Topology(64, 64, LINK, LINK, G)
    small, _ = all_reduce_time(topo, 8, "auto")
    large, _ = all_reduce_time(topo, 1 << 30, "auto")
    assert small in ("recursive-doubling", "tree", "rabenseifner")
    assert large in ("ring", "rabenseifner")
    for n in (8, 1 << 16, 1 << 30):
        _, best = all_reduce_time(topo, n, "auto")
        assert best == pytest.approx(min(ring_all_reduce(64, n, LINK, G), binary_tree(64, n, LINK, G),
                                         recursive_doubling(64, n, LINK, G), rabenseifner(64, n, LINK, G)))


def test_across_nodes_the_ring_waits_for_the_slow_link():
    fast, slow = Link(1e-6, 1 / 300e9), Link(50e-6, 1 / 10e9)
    topo = Topology(16, 8, fast, slow, 0.0, nic="node")
    n = 1 << 20
    _, seconds = all_reduce_time(topo, n, "ring")
    assert seconds == pytest.approx(2 * 15 * 50e-6 + 2 * 15 / 16 * n / 10e9)
    # NCCL's rings, one per NIC: with a NIC per rank each ring carries 1/8 of the inter-node bytes
    per_rank = Topology(16, 8, fast, slow, 0.0, nic="rank")
    assert half_collective_time(per_rank, n, reduce=False, algorithm="auto") == pytest.approx(
        15 * 50e-6 + 15 / 16 * n / (8 * 10e9))


def test_an_emulated_link_adds_its_last_piece_on_the_real_link():
    emulated = Link(alpha=1e-3, beta=8e-9, host_beta=1e-9, piece=1 << 20)
    assert emulated.p2p(1000) == pytest.approx(1e-3 + 1000 * 8e-9 + 1000 * 1e-9)
    assert emulated.p2p(4 << 20) == pytest.approx(1e-3 + (4 << 20) * 8e-9 + (1 << 20) * 1e-9)


# ----------------------------------------------------------------------------- FLOPs

GPT = {"model": {"n_layer": 3, "n_embd": 48, "n_head": 4, "block_size": 16, "vocab_size": 50},
       "data": {"kind": "synthetic-lm"}}


def test_gpt_flops_are_six_psi_plus_attention():
    cfg = from_dict(GPT)
    rows, (L, C, T, V) = 4, (3, 48, 16, 50)
    f = model_flops(cfg, V, rows)
    tokens = rows * T
    per_block = 12 * C * C + 13 * C  # c_attn 3C²+3C, c_proj C²+C, fc 4C²+4C, proj 4C²+C, 2 LayerNorms 4C
    non_embedding = L * per_block + 2 * C  # + ln_f
    assert f.params == non_embedding + V * C + T * C  # tied head: wte counted once
    head = 2 * V * C * tokens
    attention = L * 4 * T * C * tokens
    assert f.forward == pytest.approx(2 * L * per_block * tokens + head + attention)
    assert f.training == pytest.approx(3 * f.forward)
    # PaLM's count: 6 N tokens + 12 L T C tokens, N the matmul parameters (blocks and the head)
    assert f.training == pytest.approx(6 * (L * per_block + V * C) * tokens + 12 * L * T * C * tokens)
    # full recomputation runs every block's forward again: 8N instead of 6N for the blocks
    recomputed = L * f.block_forward
    assert f.training + recomputed == pytest.approx(f.training + 2 * L * per_block * tokens + attention)


def test_mlp_flops():
    cfg = from_dict({"model": {"kind": "mlp", "widths": [10, 20, 3]},
                     "data": {"kind": "synthetic-classification"}})
    f = model_flops(cfg, 0, rows=8)
    assert f.params == 10 * 20 + 20 + 20 * 3 + 3
    assert f.forward == 2 * f.params * 8 and f.unit_forward == (2 * 220 * 8, 2 * 63 * 8)
    assert f.block_forward == 0.0  # no transformer blocks to recompute


def test_backward_runs_from_the_head_to_the_embeddings():
    from engine.config.build import param_shapes
    cfg = from_dict(GPT)
    names = [name for name, _, _ in param_shapes(cfg, 50)]
    events = backward_events(cfg, 50)
    assert sum(e.share for e in events) == pytest.approx(1.0)
    order = [names[i] for e in events for i in e.ready]
    assert sorted(order) == sorted(names)  # every gradient becomes final exactly once
    assert order[0] == "ln_f.weight" and order[-1] == "wte.weight"
    assert order.index("blocks.2.mlp.layers.1.weight") < order.index("blocks.2.attn.c_attn.weight") \
        < order.index("blocks.1.mlp.layers.1.weight")


# ----------------------------------------------------------------------------- timeline

def test_timeline_overlap_exposed_and_interference():
    tl = Timeline(shares_cores=True)
    tl.compute(1.0)
    a = tl.submit(3.0, cpu=1.5)  # runs 1..4 while the training thread computes 1..3
    tl.compute(2.0)
    tl.wait(a)  # waits 3..4
    tl.blocking(0.5)
    assert (tl.now, tl.compute_s, tl.exposed_s, tl.comm_s) == (4.5, 3.0, 1.5, 3.5)
    assert tl.overlapped_s == pytest.approx(2.0)
    # 2 of the task's 3 seconds overlapped compute: 2/3 of its 1.5 CPU seconds came back onto the step
    assert tl.interference_s == pytest.approx(1.0)
    assert tl.step_s == pytest.approx(5.5)
    assert Timeline(shares_cores=False).interference_s == 0.0


def test_time_sliced_peers_meet_late():
    """The last peer falls behind by the CPU seconds computed (compute / slicing), at most `lag`; a wait
    on communication lets it catch up; at a meeting the training thread waits for what is left."""
    tl = Timeline(lag=0.25, slicing=2.0)
    tl.compute(1.0)  # behind by min(0.25, 0.5)
    a = tl.submit(0.5)  # 1.0..1.5 on the communication thread
    tl.compute(0.25)
    tl.blocking(0.1)  # waits for a 1.25..1.5, in which the peer caught up: nothing more; then 0.1
    tl.compute(0.1)  # behind by 0.05
    tl.blocking(0.1)  # 0.05 for the peer, then 0.1
    assert (a.start, a.end) == (1.0, 1.5)
    assert tl.now == pytest.approx(1.85) and tl.exposed_s == pytest.approx(0.5)
    assert tl.imbalance_s == pytest.approx(0.05) and tl.compute_s == pytest.approx(1.35)


def test_tasks_run_one_at_a_time_in_order():
    tl = Timeline()
    first, second = tl.submit(2.0), tl.submit(1.0)
    assert (first.start, first.end, second.start, second.end) == (0.0, 2.0, 2.0, 3.0)


# ----------------------------------------------------------------------------- fits

def test_nccl_tests_output_is_fitted_back_to_its_alpha_beta():
    alpha, beta, ranks = 12e-6, 1 / 180e9, 8
    text = nccl_table(alpha, beta, ranks, [8 << k for k in range(0, 25, 2)])
    rows, named = parse_nccl_tests(text)
    assert named == 8 and rows[0][0] == 8 and len(rows) == 13
    fitted = fit_nccl_all_reduce(text)
    assert fitted["alpha"] == pytest.approx(alpha, rel=0.02)
    assert fitted["busbw"] == pytest.approx(180e9, rel=0.02)


def test_nccl_fit_errors_are_one_line():
    with pytest.raises(FitError, match="no nccl-tests rows"):
        fit_nccl_all_reduce("hello")
    table = nccl_table(1e-5, 1e-10, 4, [8, 1024]).replace("# nranks 4", "")
    with pytest.raises(FitError, match="how many ranks"):
        fit_nccl_all_reduce(table)
    assert fit_nccl_all_reduce(table, ranks=4)["ranks"] == 4


def test_ring_fit_recovers_alpha_beta_gamma():
    p, alpha, beta, gamma = 2, 80e-6, 1 / 5e9, 1 / 6e9
    sizes = [4096, 65536, 1 << 20, 4 << 20]
    gather = [(p - 1) * (alpha + n / p * beta) for n in sizes]
    scatter = [g + (p - 1) / p * n * gamma for g, n in zip(gather, sizes)]
    fitted = fit_ring(p, sizes, gather, scatter)
    assert fitted == pytest.approx({"alpha": alpha, "beta": beta, "gamma": gamma}, rel=1e-6)


def test_line_fit_needs_two_sizes():
    with pytest.raises(FitError):
        line_fit([8, 8], [1.0, 1.1])


def test_expected_maximum_of_normals():
    from engine.projection.compute import expected_max_normal
    # tabulated values (e.g. Harter 1961): n = 2: 1/sqrt(pi), 3: 0.846284, 4: 1.029375, 8: 1.423600
    assert expected_max_normal(1) == 0.0
    assert expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-9)
    for n, value in ((3, 0.846284), (4, 1.029375), (8, 1.423600)):
        assert expected_max_normal(n) == pytest.approx(value, abs=2e-6)
