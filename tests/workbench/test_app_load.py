"""Under a 1 kHz event stream (9,000 events a second) the workbench handles at most ~10 updates a second,
shows the last step exactly and loses no discrete event (`nanodist-tui bench ui-events` measures the same)."""

from __future__ import annotations

import pytest

from nanodist_tui.bench_ui import MAX_UPDATES_PER_S, event_storm


@pytest.mark.slow
def test_a_1khz_stream_is_batched_shown_exactly_and_loses_nothing():
    report = event_storm(steps=3000, rate_hz=1000.0, every=50)
    assert report["last_step_shown"] == 3000
    assert report["discrete_sent"] == 60 and report["discrete_shown"] == 60
    # the batcher posts at most once per 0.1 s (one more may open a second that ends just after a post)
    assert 3 <= report["updates"] <= 3 * MAX_UPDATES_PER_S + 2
    assert report["max_updates_in_1s"] <= MAX_UPDATES_PER_S + 1
