"""Context parallelism on a calibrated machine, around the blocks: a rank's whole ring pass as timed with
its hops delivered locally (engine.projection.ring_pass_calibration) sets the blocks' total, and a hop timed
beside a block with a partner sets what each hop adds, unless waiting for a slower transfer costs more.
Figures worked out by hand on the fixture calibration of ring_kernel_helpers.py (zigzag, c = 2,
chunks of 8 tokens: B = [0.5, 0.6] ms forward, [0.9, 1.0] ms backward, the curve's attention 0.5 and 1.0 ms
a block)."""

from __future__ import annotations

import numpy as np
import pytest
from ring_kernel_helpers import MS, VOCAB, calibrated, config

from engine.comm.launch import run_ranks
from engine.config.vocabulary import CONTEXT_LAYOUTS
from engine.parallel.context.layout import SequenceLayout
from engine.parallel.context.ring_attention import Ring, ring_backward, ring_forward
from engine.projection.calibrate import Calibration
from engine.projection.clusters import load_cluster
from engine.projection.context import ContextParallel
from engine.projection.flops import FlopsOf, model_signature
from engine.projection.machine import make_machine
from engine.projection.project import predict
from engine.projection.ring_calibration import degree_key
from engine.projection.ring_pass_calibration import Loopback, hop_key, pass_key, time_hops, time_ring_passes


def with_figures(tmp_path, cfg, figures: dict[str, float]) -> Calibration:
    """The kernels' fixture calibration and `figures` (seconds at 128 tokens, twice that at 256, ...)."""
    cal = calibrated(tmp_path, cfg)
    level = cal.data["models"][model_signature(cfg, VOCAB)]["fp32"]["2"]
    for name, seconds in figures.items():
        level[degree_key(2, name)] = [seconds, 2 * seconds, 4 * seconds, 8 * seconds]
    return Calibration(cal.data)


def test_a_timed_pass_sets_the_blocks_total_in_their_proportions(tmp_path):
    """Passes of 2.2 ms forward and 3.8 ms backward, twice the kernels' 1.1 and 1.9: every hop's blocks
    double, and each block adds 2.2 − 0.5 and 3.8 − 1.0 ms over the curve."""
    cfg = config("zigzag")
    cal = with_figures(tmp_path, cfg, {pass_key("zigzag", "forward"): 2.2 * MS,
                                       pass_key("zigzag", "backward"): 3.8 * MS})
    step = predict(cfg, load_cluster("this-machine"), cal, VOCAB)[0]
    assert step.cp["hop_blocks_forward_s"] == pytest.approx([1.0 * MS, 1.2 * MS], rel=1e-12)
    assert step.cp["hop_blocks_backward_s"] == pytest.approx([1.8 * MS, 2.0 * MS], rel=1e-12)
    assert step.cp["extra_forward_s"] == pytest.approx(1.7 * MS, rel=1e-12)
    assert step.forward_s == pytest.approx(30e-6 * 128 + 2 * 1.7 * MS, rel=1e-9)
    assert step.backward_s == pytest.approx(60e-6 * 128 + 2 * 2.8 * MS, rel=1e-9)


def context_term(tmp_path, figures: dict[str, float]) -> ContextParallel:
    cfg = config("zigzag")
    cal = with_figures(tmp_path, cfg, figures)
    machine = make_machine(load_cluster("this-machine"), cfg, 2, cal, FlopsOf(cfg, VOCAB))
    cp = ContextParallel(cfg, 8, machine)
    cp.time_blocks(1.0, 1.0)
    return cp


def test_a_measured_hop_is_what_each_hop_adds(tmp_path):
    """K, V hops 0.2 ms, accumulator hops 0.3 ms, each more than waiting for this machine's transfers
    beside the blocks: forward c − 1 = 1 hop; backward a K, V hop beside hop 0's blocks, an accumulator hop
    beside hop 1's, and the accumulator's last hop home, waited for whole."""
    cp = context_term(tmp_path, {hop_key("kv"): 0.2 * MS, hop_key("grad"): 0.3 * MS})
    assert cp.kv_s < 0.5 * MS and cp.grad_s < 0.5 * MS  # shorter than the blocks beside them
    assert cp.block_forward_s == pytest.approx(0.2 * MS, rel=1e-12)
    assert cp.block_backward_s == pytest.approx(0.2 * MS + 0.3 * MS + cp.grad_s, rel=1e-12)


def test_without_a_measured_hop_only_the_wait_is_exposed(tmp_path):
    cp = context_term(tmp_path, {})
    assert cp.block_forward_s == pytest.approx(max(0.0, cp.kv_s - cp.forward_blocks[0]), abs=1e-15)
    assert cp.block_backward_s == pytest.approx(max(0.0, cp.kv_s - cp.backward_blocks[0])
                                                + max(0.0, cp.grad_s - cp.backward_blocks[1]) + cp.grad_s)


def test_a_transfer_longer_than_the_blocks_is_waited_for_not_the_measured_hop(tmp_path):
    cp = context_term(tmp_path, {hop_key("kv"): 0.2 * MS, hop_key("grad"): 0.3 * MS})
    assert cp._exposed([("kv", 5 * MS)], 1 * MS) == pytest.approx(4 * MS)  # a slow link: the wait wins
    assert cp._exposed([("kv", 0.1 * MS), ("grad", 0.1 * MS)], 1 * MS) == pytest.approx(0.5 * MS)


def test_a_loopback_ring_computes_what_a_one_rank_ring_would_see_of_its_own_keys():
    """Every hop brings back the rank's own K and V: the pass is the rank's blocks, each against its own
    keys, merged as a real ring merges them (finite, of the right shapes)."""
    rng = np.random.default_rng(0)
    q, k, v, g = (rng.standard_normal((2, 2, 8, 4)) for _ in range(4))
    for layout in CONTEXT_LAYOUTS:
        for rank in range(2):
            ring = Ring(Loopback(rank, 2), SequenceLayout(layout, 2))
            out, lse = ring_forward(ring, q, k, v)
            grads = ring_backward(ring, q, k, v, out, lse, g)
            assert out.shape == q.shape and all(d.shape == q.shape for d in grads)
            assert np.isfinite(out).all() and all(np.isfinite(d).all() for d in grads)
            assert ring.work["blocks"] == sum(len(ring.plan(8, (rank - h) % 2)) for h in range(2))


def test_the_calibration_times_both_layouts_passes_and_both_hops_with_a_partner():
    figures = time_ring_passes(2, 2, 4, 16, 2, "fp32", repeats=1)
    assert set(figures) == {pass_key(layout, phase) for layout in CONTEXT_LAYOUTS
                            for phase in ("forward", "backward")}
    assert all(seconds > 0 for seconds in figures.values())
    hops = run_ranks(2, "threads", lambda comm, emit: time_hops(comm, 2, 2, 4, 16, 2, "fp32", repeats=2))
    for rank_figures in hops:
        assert set(rank_figures) == {hop_key("kv"), hop_key("grad")}
        assert all(seconds >= 0 for seconds in rank_figures.values())


def test_figures_are_kept_per_degree_and_another_degrees_are_not_taken(tmp_path):
    """The calibration names every ring figure by its degree (the rank's rows and chunks depend on it): a
    calibration holding only degree 4's leaves a CP 2 run to the FLOPs."""
    cfg = config("zigzag")
    cal = calibrated(tmp_path, cfg)
    level = cal.data["models"][model_signature(cfg, VOCAB)]["fp32"]["2"]
    for name in [k for k in level if k.startswith("cp2_")]:
        level[name.replace("cp2_", "cp4_", 1)] = level.pop(name)
    step = predict(cfg, load_cluster("this-machine"), Calibration(cal.data), VOCAB)[0]
    assert not step.cp["kernels_timed"]


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_calibration_rank_times_a_degree_under_its_name_and_hops_only_with_a_partner(ranks):
    from engine.config import to_dict
    from engine.projection.compute_calibration import _ring_blocks
    cfg = to_dict(config("zigzag"))
    figures = run_ranks(ranks, "threads", lambda comm, emit: _ring_blocks(comm, cfg, "fp32", 1, 2))
    names = set(figures[0])
    assert all(name.startswith("cp2_") for name in names)
    assert {degree_key(2, pass_key(layout, phase)) for layout in CONTEXT_LAYOUTS
            for phase in ("forward", "backward")} <= names
    hops = {degree_key(2, hop_key(m)) for m in ("kv", "grad")}
    assert (hops <= names) if ranks == 2 else not (hops & names)


def test_the_planners_check_times_the_degrees_it_may_choose():
    from engine.config.presets import load_preset
    from engine.projection.planner_validate import context_degrees
    mini = load_preset("gpt-mini")[0]  # context 64
    assert context_degrees(mini, 2) == [2] and context_degrees(mini, 4) == [2, 4]
    assert context_degrees(mini, 6) == [2]  # 64 tokens are not 12 chunks
    assert context_degrees(load_preset("mlp")[0], 2) == []
