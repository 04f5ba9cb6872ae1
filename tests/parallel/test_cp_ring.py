"""Ring attention (engine.parallel.context) equals whole-sequence attention in float64: c in {2, 4}, causal
and not, contiguous and zigzag layouts — the output and the gradients of queries, keys and values within 1e-12
relative of plain NumPy softmax attention (and of the engine's fused causal attention); the by-hand ring
(lists in one process) gives the same; the online-softmax merge does not depend on the order of the blocks;
the causal work per rank is counted: contiguous max/mean = 2c/(c+1), zigzag 1."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from engine import ops
from engine.comm.launch import run_ranks
from engine.parallel.context import blocks, by_hand_ring
from engine.parallel.context.layout import SequenceLayout
from engine.tensor import Tensor
from tests.cp_helpers import full_attention, gather, problem, ring_rank

T = 16  # 4 ranks x zigzag's 2 chunks of 2 tokens
CASES = [(c, kind, causal) for c in (2, 4) for kind in ("contiguous", "zigzag") for causal in (True, False)]
IDS = [f"c{c}-{kind}-{'causal' if causal else 'full'}" for c, kind, causal in CASES]


def close(actual, expected, rel=1e-12):
    """Within `rel` of the reference, relative to its largest element."""
    np.testing.assert_allclose(actual, expected, rtol=rel, atol=rel * np.abs(expected).max())


@pytest.mark.parametrize("c, kind, causal", CASES, ids=IDS)
def test_ring_equals_whole_attention(c, kind, causal):
    q, k, v, g = problem((2, 3, T, 8), seed=c)
    ranks = run_ranks(c, "threads", ring_rank, args=(kind, causal, [q, k, v, g]), timeout_s=60)
    reference = full_attention(q, k, v, g, causal)
    for key, expected in zip(("out", "dq", "dk", "dv"), reference):
        close(gather(ranks, key, T), expected)
    if causal:  # the engine's fused causal attention agrees too
        tensors = [Tensor(a, requires_grad=True) for a in (q, k, v)]
        out = ops.causal_attention(*tensors)
        out.backward(g)
        close(gather(ranks, "out", T), out.data)
        for key, t in zip(("dq", "dk", "dv"), tensors):
            close(gather(ranks, key, T), t.grad)


@pytest.mark.parametrize("c, kind, causal", CASES, ids=IDS)
def test_by_hand_ring_equals_the_real_one(c, kind, causal):
    q, k, v, g = problem((2, 3, T, 8), seed=10 + c)
    layout = SequenceLayout(kind, c)
    pos = [layout.positions(T, r) for r in range(c)]
    qs, ks, vs, gs = (by_hand_ring.split(a, pos) for a in (q, k, v, g))
    out, lse = by_hand_ring.ring_forward(qs, ks, vs, pos, causal)
    dq, dk, dv = by_hand_ring.ring_backward(qs, ks, vs, pos, out, lse, gs, causal)
    ranks = run_ranks(c, "threads", ring_rank, args=(kind, causal, [q, k, v, g]), timeout_s=60)
    for r in range(c):
        for name, mine in (("out", out), ("dq", dq), ("dk", dk), ("dv", dv)):
            close(ranks[r][name], mine[r])
    reference = full_attention(q, k, v, g, causal)
    whole = [np.zeros_like(a) for a in reference]
    for r in range(c):
        for arr, part in zip(whole, (out[r], dq[r], dk[r], dv[r])):
            arr[..., pos[r], :] = part
    for arr, expected in zip(whole, reference):
        close(arr, expected)


def test_the_merge_does_not_depend_on_the_order_of_the_blocks():
    """Attention of 12 queries over 4 key chunks merged in all 24 orders: the whole softmax each time."""
    q, k, v, g = problem((2, 2, 12, 8), seed=3)
    reference = full_attention(q, k, v, g, causal=False)[0]
    parts = [blocks.forward(q, k[:, :, i:i + 3], v[:, :, i:i + 3], False) for i in range(0, 12, 3)]
    for order in itertools.permutations(range(4)):
        out, lse = np.zeros_like(q), np.full(q.shape[:-1], -np.inf)
        for i in order:
            blocks.merge(out, lse, *parts[i])
        close(out, reference)
        out_h, lse_h = np.zeros_like(q), np.full(q.shape[:-1], -np.inf)
        for i in order:
            out_h, lse_h = by_hand_ring.merge(out_h, lse_h, *parts[i])
        close(out_h, reference)


@pytest.mark.parametrize("c", [2, 3, 4])
def test_causal_work_per_rank_is_counted(c):
    """Blocks each rank computes under causal attention, counted by the ring as it runs: the contiguous
    layout's busiest rank does 2c/(c+1) of the mean, zigzag's ranks all the same."""
    t = 4 * c
    q, k, v, g = problem((1, 1, t, 4), seed=c)
    counted = {}
    for kind in ("contiguous", "zigzag"):
        ranks = run_ranks(c, "threads", ring_rank, args=(kind, True, [q, k, v, g]), timeout_s=60)
        counted[kind] = [r["work"]["blocks"] for r in ranks]
        assert counted[kind] == [SequenceLayout(kind, c).causal_blocks(r) for r in range(c)]
    contiguous, zigzag = (np.array(counted[k]) for k in ("contiguous", "zigzag"))
    assert contiguous.tolist() == list(range(1, c + 1))
    assert contiguous.max() / contiguous.mean() == pytest.approx(2 * c / (c + 1), rel=1e-15)
    assert zigzag.tolist() == [2 * c + 1] * c and zigzag.max() / zigzag.mean() == 1.0


def test_layouts_tile_the_sequence():
    for kind, c in itertools.product(("contiguous", "zigzag"), (1, 2, 4)):
        layout = SequenceLayout(kind, c)
        held = np.concatenate([layout.positions(32, r) for r in range(c)])
        assert sorted(held.tolist()) == list(range(32))
    assert SequenceLayout("zigzag", 2).positions(8, 0).tolist() == [0, 1, 6, 7]
    with pytest.raises(ValueError, match="does not cut into 4 equal chunks"):
        SequenceLayout("zigzag", 2).positions(6, 0)


def test_the_by_hand_ring_stays_under_150_lines():
    with open(by_hand_ring.__file__) as f:
        assert len(f.read().splitlines()) < 150
