"""Every layout of 8 ranks the engine trains trains the same model as one device: torchtitan's loss comparison
across parallelisms, made exact. A float64 GPT (4 blocks, 4 heads, width 32, context 16, tied embeddings,
dropout on) on the threads backend, 5 clipped AdamW steps on the same global batch in the same two
micro-batches: every step's loss and gradient norm and every parameter after the steps (the whole model,
read back from the ranks that hold it) within 1e-10 of one device's, on every rank.

Layouts: data parallelism alone and under ZeRO 1-3; tensor parallelism beside it (with ZeRO-1, with sequence
parallelism); pipeline parallelism, 1F1B and interleaved, beside data and tensor parallelism; context
parallelism beside data, tensor and pipeline parallelism; a mixture of experts split over 2, 4 and 8 expert
ranks, alone, under ZeRO-1 and ZeRO-2, and beside tensor (with sequence parallelism too), pipeline and
context parallelism, up to all five axes at once; one mesh laid out in another axis order. Layouts the
config rules still refuse are listed in REFUSED, each with the key of its one-line refusal: when its axis
lands, it moves to LAYOUTS.
"""

from __future__ import annotations

from functools import cache

import pytest

from engine.comm.launch import run_ranks
from engine.config import ConfigError, from_dict
from tests.layout_helpers import Layout, assert_same_training, layout_config, train_rank

WORLD = 8

LAYOUTS = [
    Layout(WORLD),                                     # DP 8
    Layout(WORLD, zero=1),                             # DP 8, ZeRO-1
    Layout(WORLD, zero=2),
    Layout(WORLD, zero=3),
    Layout(WORLD, tensor=2),                           # DP 4 x TP 2
    Layout(WORLD, tensor=2, zero=1),
    Layout(WORLD, tensor=4, sp=True),                  # DP 2 x TP 4, sequence parallel
    Layout(WORLD, tensor=2, pipeline=2),               # DP 2 x PP 2 x TP 2
    Layout(WORLD, tensor=2, pipeline=2, zero=1, sp=True),
    Layout(WORLD, pipeline=2, chunks=2),               # DP 4 x PP 2, interleaved (4 stages of 1 block)
    Layout(WORLD, pipeline=4),                         # DP 2 x PP 4
    Layout(WORLD, tensor=2, context=2),                # DP 2 x CP 2 x TP 2
    Layout(WORLD, tensor=2, context=2, zero=2, sp=True),
    Layout(WORLD, context=4),                          # DP 2 x CP 4
    Layout(WORLD, tensor=2, context=2, pipeline=2),    # PP 2 x CP 2 x TP 2
    Layout(WORLD, tensor=2, pipeline=2, order="pp-dp-ep-cp-tp"),  # tensor partners farthest apart
    Layout(WORLD, expert=4, moe=True),                 # MoE: DP 8, experts over EP 4
    Layout(WORLD, expert=8, moe=True),                 # MoE: one expert per rank
    Layout(WORLD, expert=4, zero=1, moe=True),         # MoE: EP 4, ZeRO-1 (experts' state over edp 2)
    Layout(WORLD, expert=2, zero=2, moe=True),         # MoE: EP 2, ZeRO-2 (over edp 4)
    Layout(WORLD, tensor=2, expert=4, moe=True),       # MoE: DP 4 x TP 2, EP 4 (experts tensor-split)
    Layout(WORLD, pipeline=2, expert=4, moe=True),     # MoE: DP 4 x PP 2, EP 4
    Layout(WORLD, context=2, expert=4, moe=True),      # MoE: DP 4 x CP 2, EP 4 (carved out of DP x CP)
    Layout(WORLD, tensor=2, pipeline=2, expert=2, zero=1, moe=True),
    Layout(WORLD, tensor=2, context=2, expert=2, zero=2, moe=True),
    Layout(WORLD, tensor=4, expert=2, zero=2, sp=True, moe=True),   # MoE beside sequence parallelism
    Layout(WORLD, tensor=2, context=2, pipeline=2, expert=2, sp=True, moe=True),  # all five axes, and SP
]

# Layouts the config rules refuse in this release: (layout, the key its one line names)
REFUSED = [
    (Layout(WORLD, expert=4, zero=3, moe=True), "parallel.zero_stage"),         # EP with ZeRO-3
]


@cache
def _one_device(moe: bool) -> dict:
    return run_ranks(1, "threads", train_rank, args=(layout_config(Layout(moe=moe)),), timeout_s=120)[0]


@pytest.mark.parametrize("layout", LAYOUTS, ids=[layout.name for layout in LAYOUTS])
def test_every_layout_trains_what_one_device_trains(layout):
    ranks = run_ranks(WORLD, "threads", train_rank, args=(layout_config(layout),), timeout_s=300)
    assert len(ranks) == WORLD
    assert_same_training(ranks, _one_device(layout.moe))


def test_the_reference_trains():
    """The comparison is not between runs that stand still: the loss falls, and steps 2-5 move every
    parameter tensor of the dense model and of the MoE."""
    for moe in (False, True):
        one = _one_device(moe)
        start = run_ranks(1, "threads", train_rank, args=(layout_config(Layout(moe=moe), steps=1),),
                          timeout_s=120)[0]
        assert one["losses"][-1] < one["losses"][0]
        moved = [name for name, value in one["params"].items() if value != start["params"][name]]
        assert moved == list(one["params"])


@pytest.mark.parametrize("layout, key", REFUSED, ids=[layout.name for layout, _ in REFUSED])
def test_a_layout_not_built_yet_is_refused_in_one_line(layout, key):
    with pytest.raises(ConfigError) as info:
        from_dict(layout_config(layout))
    text = str(info.value)
    assert info.value.key == key and "\n" not in text, text
