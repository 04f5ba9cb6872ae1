"""The context pane: per rank the blocks and scores its ring attention computed, bars against the busiest
rank, the busiest over the mean; shown only for context-parallel runs; the latest step every rank reported."""

from __future__ import annotations

import pytest

from engine.events import ContextWork
from nanodist_tui.panes import panes_for
from nanodist_tui.run_info import RunInfo
from nanodist_tui.widgets.context_pane import render_work
from tests.context_run_helpers import context_run


def test_the_busiest_rank_against_the_mean():
    reports = [e for e in context_run() if isinstance(e, ContextWork) and e.step == 2]
    text = render_work(2, reports, 60, "#", ".").plain
    lines = text.splitlines()
    assert lines[0] == "step 2: ring attention, contiguous layout, 2 ranks per context-parallel group"
    rows = [line.split() for line in lines if line[:4].strip().isdigit()]
    assert [(r[0], r[1], r[2]) for r in rows] == [("0", "2", "8,388,608"), ("1", "4", "16,777,216"),
                                                  ("2", "2", "8,388,608"), ("3", "4", "16,777,216")]
    assert [r[3].count("#") for r in rows] == [12, 24, 12, 24]  # bars of 24 cells against the busiest
    assert "busiest / mean: blocks 1.33, scores 1.33" in text  # 2c/(c+1) at c = 2
    assert "contiguous 2c/(c+1) = 1.33, zigzag 1.00" in text


@pytest.mark.parametrize("context, shown", [(1, False), (2, True)])
def test_the_pane_is_there_for_context_parallel_runs_only(context, shown):
    info = RunInfo.from_config({"parallel": {"world_size": 2, "context": context}})
    assert ("context" in [p.id for p in panes_for(info)]) == shown
