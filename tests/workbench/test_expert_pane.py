"""The expert pane's figures (nanodist_tui/expert_chart.py) from hand-written ExpertLoad events
(tests/expert_run_helpers.py): tokens per expert summed over the ranks, rows per rank, max/mean load, drops,
entropy and aux loss averaged; the pane appears only for a run with experts, and shows the latest step every
rank has reported."""

from __future__ import annotations

import pytest

from engine.events import ExpertLoad
from nanodist_tui.expert_chart import layer_loads, render
from nanodist_tui.panes import panes_for
from nanodist_tui.run_info import RunInfo
from tests.expert_run_helpers import moe_run, received


def _step(events, step):
    return [e for e in events if isinstance(e, ExpertLoad) and e.step == step]


def test_layer_loads_sum_the_ranks():
    busy, balanced = layer_loads(_step(moe_run(), 2))[1], layer_loads(_step(moe_run(), 2))[0]
    assert busy.tokens == [256, 128, 64, 0, 0, 32, 0, 0]
    assert busy.received == dict(enumerate(received(2, 1)))
    assert busy.received[3] == 0 and sum(busy.received.values()) == sum(busy.tokens)
    assert busy.imbalance == pytest.approx(256 / (480 / 8))
    assert balanced.imbalance == 1.0
    assert busy.dropped == 8 and busy.entropy == pytest.approx(1.25 + 0.25 * 1.5 / 4)


def test_the_text_names_every_figure():
    text = render(2, layer_loads(_step(moe_run(), 2)), 4, 2, 80, "#", ".").plain
    assert "step 2 · 2 MoE layers · 8 experts, 2 per rank of each EP group of 4" in text
    assert "layer 2 (block 2)" in text and "max/mean load 4.27 · dropped 8" in text
    assert "ln 8 = 2.079 nats" in text and "  e0  " in text and " ep3\n" in text


def test_only_a_run_with_experts_has_the_pane():
    started = moe_run()[0]
    assert "experts" in [s.id for s in panes_for(RunInfo.from_started(started))]
    dense = RunInfo.from_config({"parallel": {"world_size": 4}})
    assert "experts" not in [s.id for s in panes_for(dense)]


def test_pipeline_ranks_report_their_stages_layers():
    """DP 2 x PP 2: ranks 0 and 1 hold block 0's experts, ranks 2 and 3 block 2's; each layer sums only the
    ranks of its stage, in block order, and is titled by its block."""
    def load(rank, block, tokens):
        return ExpertLoad(step=1, rank=rank, tokens_per_expert=[tokens], received=[sum(tokens)], dropped=[0],
                          entropy=[1.0 + rank], aux_loss=[0.1 * (rank + 1)], blocks=[block])
    events = [load(2, 2, [1, 2]), load(0, 0, [3, 4]), load(3, 2, [5, 6]), load(1, 0, [7, 8])]
    first, second = layer_loads(events)
    assert (first.block, first.tokens, first.received) == (0, [10, 12], {0: 7, 1: 15})
    assert (second.block, second.tokens, second.received) == (2, [6, 8], {2: 3, 3: 11})
    assert second.entropy == pytest.approx(3.5) and second.aux_loss == pytest.approx(0.35)
    text = render(1, [first, second], 1, 1, 60, "#", ".").plain
    assert "layer 1 (block 0)" in text and "layer 2 (block 2)" in text
