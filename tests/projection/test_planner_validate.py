"""`plan --validate` end to end on a tiny case: gpt-mini scaled to 2 ranks here, calibrated, planned, its
choices run on the processes backend; the verdict is the one its measured runs give."""

from __future__ import annotations

import pytest

from engine.config.presets import load_preset
from engine.projection.planner_validate import paired_ratio, scaled_down, validate_plan

pytestmark = pytest.mark.slow  # calibrates this machine and starts rank processes


def test_a_large_preset_is_scaled_down_to_a_small_model_on_processes():
    big = load_preset("presets/published/bloom-176b.toml")[0]
    cfg, model = scaled_down(big)
    assert cfg.model == load_preset("gpt-mini")[0].model and "gpt-mini" in model
    assert cfg.parallel.backend == "processes" and cfg.name == big.name


def test_paired_ratio_is_the_median_of_the_rounds_ratios():
    """The machine slows 2x and 4x over three rounds; the other run is 10% slower than the first in each."""
    first, other = [1.0, 2.0, 4.0], [1.1, 2.2, 4.4]
    assert paired_ratio(other, first) == pytest.approx(1.1)
    # one round where a burst of load hit the other run alone: the median of the ratios leaves it out
    assert paired_ratio([1.1, 9.0, 4.4], first) == pytest.approx(1.1)


def test_validate_end_to_end_on_two_ranks():
    report = validate_plan(load_preset("gpt-mini")[0], ranks=2, top=2, steps=2, repeats=1, warmup=1)
    runs = report["runs"]
    assert report["ranks"] == 2 and 1 <= len(runs) <= 2 and runs[0]["planned_rank"] == 1
    assert all(r["measured_s"] > 0 and r["predicted_s"] > 0 for r in runs)
    best = min(runs, key=lambda r: r["over_first"])
    assert report["first_is_best"] == (best is runs[0])
    assert report["first_over_best"] == pytest.approx(1 / best["over_first"] - 1)
    assert report["within_10pct"] == (report["first_over_best"] <= 0.10)
