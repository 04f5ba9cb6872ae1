"""Under context parallelism the estimator predicts every rank's ledger to the byte: model states at rest
(ZeRO shards over the data x context ranks) and every category's peak over the step (activations over the
rank's own tokens; the ring's keys and values, and backward their gradients, in flight as communication
buffers) over a grid of context degree and layout, tensor degree, ZeRO stage, activation checkpointing and
precision. A rank's activations are one device's divided by c."""

from __future__ import annotations

import pytest

from engine.memory.estimator import estimate
from engine.memory.ledger import CATEGORIES, MODEL_STATES
from tests.tp_memory_helpers import measured, tiny


def cp_tiny(world: int, c: int, layout: str = "zigzag", dropout: float = 0.0, **over):
    return tiny(parallel__world_size=world, parallel__context=c, parallel__context_layout=layout,
                model__dropout=dropout, **over)


# (world, context, layout, tensor, ZeRO stage, checkpointing, dtype)
GRID = [(2, 2, "zigzag", 1, 0, False, "fp32"), (2, 2, "contiguous", 1, 1, True, "fp16"),
        (4, 4, "zigzag", 1, 0, True, "bf16"), (4, 2, "zigzag", 1, 1, False, "fp64"),
        (4, 2, "zigzag", 2, 0, False, "fp16"), (4, 2, "contiguous", 2, 1, True, "fp32"),
        (4, 2, "zigzag", 1, 2, False, "fp32"), (4, 2, "zigzag", 1, 3, True, "bf16"),
        (8, 2, "zigzag", 2, 2, True, "fp64"), (8, 2, "contiguous", 2, 3, False, "fp16")]


# with dropout: the masks kept are the rank's tokens' (attention's is drawn again in backward, never kept)
DROPOUT = [(2, 2, "zigzag", 1, 0, False, "fp32"), (4, 2, "contiguous", 2, 1, True, "fp64"),
           (4, 4, "zigzag", 1, 3, False, "bf16")]


@pytest.mark.parametrize("world, c, layout, t, stage, checkpointing, dtype, dropout",
                         [(*g, 0.0) for g in GRID] + [(*g, 0.1) for g in DROPOUT])
def test_estimate_equals_the_ledger_to_the_byte(world, c, layout, t, stage, checkpointing, dtype, dropout):
    cfg = cp_tiny(world, c, layout, dropout, parallel__tensor=t, parallel__zero_stage=stage,
                  precision__dtype=dtype, memory__checkpointing="blocks" if checkpointing else "none")
    e = estimate(cfg)
    assert e.category_peaks()["comm_buffers"] > 0
    predicted = (e.states, e.category_peaks(), e.maxima["forward"]["activations"],
                 e.maxima["backward"]["activations"])
    for r in measured(cfg):
        assert ({k: r["at_rest"][k] for k in MODEL_STATES}, {c: max(m[c] for m in r["maxima"].values())
                for c in CATEGORIES}, r["maxima"]["forward"]["activations"],
                r["maxima"]["backward"]["activations"]) == predicted, f"rank {r['rank']}"


def test_the_ring_buffers_are_the_keys_and_values_in_flight():
    """fp16, CP 2: forward holds its K, V (2·b·(s/2)·h·2 bytes) and the received pair; backward adds their
    float32 gradients' accumulator, both pairs during a hop."""
    b, s, h = 4, 8, 16  # tiny(): global batch 4 on one data-parallel rank, context 8, width 16
    kv = 2 * b * (s // 2) * h * 2
    e = estimate(cp_tiny(2, 2, precision__dtype="fp16"))
    assert e.maxima["forward"]["comm_buffers"] == 2 * kv
    assert e.maxima["backward"]["comm_buffers"] == 2 * (kv + 2 * kv)


def test_activations_divide_by_the_context_degree():
    """Every array kept for backward is over the rank's s/c tokens: the activations of CP c are one device's
    / c, the token ids and targets included (a CP rank's are its own slices, one device's the batch's)."""
    one = estimate(tiny(model__dropout=0.0, precision__dtype="fp64"))
    for c in (2, 4):
        cp = estimate(cp_tiny(c, c, precision__dtype="fp64"))
        assert cp.maxima["forward"]["activations"] * c == one.maxima["forward"]["activations"]
