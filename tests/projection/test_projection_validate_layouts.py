"""The held-out layouts validation end to end on a tiny GPT (one of each dimension: ZeRO-1, TP with SP, PP
1F1B, CP zigzag, EP; 1 round of 1 step after 1 of warm-up): every case is calibrated, predicted and run on
the processes backend, the report has every figure the table prints, model-state memory equals the ledger
byte for byte and the activations equal the ledger's peak (with experts, the expert group's mean rank's,
phase by phase: the estimate assumes balanced routing, the run routes as it learns, and its busiest rank
holds more than the estimate)."""

from __future__ import annotations

import pytest

from engine.config import from_dict
from engine.projection.clusters import load_cluster
from engine.projection.validate_layouts import LAYOUT_CASES, QUICK_LAYOUTS, layout_cases, validate_layouts
from nanodist_tui.cli.project import print_validation

TINY = {"name": "tiny", "model": {"n_layer": 2, "n_embd": 32, "n_head": 4, "block_size": 16},
        "data": {"kind": "synthetic-lm", "n_samples": 256}, "train": {"global_batch": 32}}


def test_the_layouts_cover_every_dimension_the_engine_trains():
    labels = [label for label, _ in LAYOUT_CASES]
    assert len(labels) >= 12 and set(QUICK_LAYOUTS) <= set(labels)
    keys = {k: v for _, overrides in LAYOUT_CASES for k, v in overrides.items()}
    for axis in ("parallel.tensor", "parallel.sequence_parallel", "parallel.pipeline", "parallel.context",
                 "parallel.expert", "parallel.zero_stage"):
        assert axis in keys, axis
    schedules = {o["parallel.schedule"] for _, o in LAYOUT_CASES if "parallel.schedule" in o}
    assert len(schedules) >= 2
    assert [label for label, _ in layout_cases(quick=True)] == list(QUICK_LAYOUTS)


@pytest.mark.slow
def test_the_validation_runs_every_dimension_end_to_end_and_memory_matches(capsys):
    report = validate_layouts(from_dict(TINY), load_cluster("this-machine"), repeats=1, quick=True, steps=1,
                              warmup=1, calibration_steps=2)
    assert [c["label"] for c in report["cases"]] == list(QUICK_LAYOUTS)
    for case in report["cases"]:
        assert case["predicted_s"] > 0 and case["measured_s"] > 0
        assert case["memory_exact"], case["label"]
        assert case["measured_activations"] == [case["predicted_activations"]], case["label"]
        if "MoE" in case["label"]:
            assert case["busiest_activations"][0] > case["predicted_activations"], case
    assert report["memory_exact"] and -1.0 <= report["kendall_tau"] <= 1.0
    print_validation(report, "tiny")
    printed = capsys.readouterr().out
    assert "Kendall tau" in printed and "activations within" in printed
    assert all(label in printed for label in QUICK_LAYOUTS)
