"""Context parallelism on a calibrated machine: ring attention's blocks at the seconds the calibration timed
(engine.projection.ring_calibration), not their FLOPs, against figures worked out here by hand on the
fixture calibration (SMALL: s = 32, 2 blocks; forward 30 us a token and backward 60 with 2 busy ranks)."""

from __future__ import annotations

import pytest
from projection_helpers import fixture_calibration
from ring_kernel_helpers import MS, VOCAB, calibrated, config

from engine.projection.clusters import load_cluster
from engine.projection.project import predict
from engine.projection.ring_calibration import chunk_sizes, key, time_ring_blocks


@pytest.mark.parametrize("rows, scale", [(8, 1), (16, 2)])
def test_zigzag_blocks_replace_the_curves_attention(tmp_path, rows, scale):
    """c = 2 zigzag, chunks of 8 tokens: rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2. Hop 0 (own
    keys): each rank 2 diagonal blocks and 1 whole (3 against 0, 2 against 1); hop 1: 2 whole each (3
    against 1 and 2; 1 and 2 against 0). So B = [2·0.1 + 0.3, 2·0.3] = [0.5, 0.6] ms forward and
    [2·0.2 + 0.5, 2·0.5] = [0.9, 1.0] backward; the curve at the rank's 128 tokens holds half of the
    one-device attention (1.0, 2.0 ms), so each block adds 1.1 − 0.5 = 0.6 ms forward and 1.9 − 1.0 = 0.9
    backward to 30 us × 128 tokens and twice that. With 16 rows (256 tokens) every kernel takes twice as
    long (the calibration's second size)."""
    cfg = config("zigzag", rows)
    step = predict(cfg, load_cluster("this-machine"), calibrated(tmp_path, cfg), VOCAB)[0]
    assert step.cp["kernels_timed"]
    assert step.cp["hop_blocks_forward_s"] == pytest.approx([0.5 * MS * scale, 0.6 * MS * scale], rel=1e-12)
    assert step.cp["hop_blocks_backward_s"] == pytest.approx([0.9 * MS * scale, 1.0 * MS * scale], rel=1e-12)
    tokens = 128 * scale
    assert step.forward_s == pytest.approx(30e-6 * tokens + 2 * 0.6 * MS * scale, rel=1e-9)
    assert step.backward_s == pytest.approx(60e-6 * tokens + 2 * 0.9 * MS * scale, rel=1e-9)


def test_contiguous_blocks_are_the_last_ranks(tmp_path):
    """c = 2 contiguous, chunks of 16: hop 0 each rank its diagonal block (0.25 ms forward, 0.4 backward);
    hop 1 only rank 1 computes, its whole block against rank 0's keys (0.7, 1.1). Per block 0.95 − 0.5 =
    0.45 ms forward and 1.5 − 1.0 = 0.5 backward over the curve."""
    cfg = config("contiguous")
    step = predict(cfg, load_cluster("this-machine"), calibrated(tmp_path, cfg), VOCAB)[0]
    assert step.cp["hop_blocks_forward_s"] == pytest.approx([0.25 * MS, 0.7 * MS], rel=1e-12)
    assert step.forward_s == pytest.approx(30e-6 * 128 + 2 * 0.45 * MS, rel=1e-9)
    assert step.backward_s == pytest.approx(60e-6 * 128 + 2 * 0.5 * MS, rel=1e-9)


def test_without_timed_kernels_the_blocks_are_their_flops(tmp_path):
    cfg = config("zigzag")
    step = predict(cfg, load_cluster("this-machine"), fixture_calibration(tmp_path / "c.json", cfg), VOCAB)[0]
    assert not step.cp["kernels_timed"] and step.cp["extra_forward_s"] == 0.0


def test_the_calibration_times_every_kernel_of_both_layouts():
    assert chunk_sizes(256, 2) == [64, 128] and chunk_sizes(32, 4) == [4, 8]
    figures = time_ring_blocks(2, 2, 4, 16, 2, "fp32", repeats=1)
    assert set(figures) == {key(kind, phase, chunk) for kind in ("diagonal", "whole")
                            for phase in ("forward", "backward") for chunk in (4, 8)} | \
        {key("one_device", phase) for phase in ("forward", "backward")}
    assert all(seconds > 0 for seconds in figures.values())
