"""The published runs (engine/projection/planner_published.py, docs/planner.md): each run's layout projected
on its cluster file stays within the error docs/planner.md states against the throughput its paper
reports; the cluster files cite a source for every figure; the one fitted run is matched."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.projection.clusters import find_cluster, load_cluster
from engine.projection.planner_published import RUNS, fit_efficiency, project_run, run_config
from tests.projection_helpers import assert_every_figure_cites

PUBLISHED_CLUSTERS = ("selene-a100", "jean-zay-a100", "meta-h100-roce")
SOURCES = ("nominal", "reported", "assumed", "fitted")
# What docs/planner.md states: every predicted run within STATED of its reported TFLOP/s per GPU, but the
# 1.7B row, the model's known miss (the efficiency curve has no dependence on the layers' width): +40..+70%.
STATED = 0.20
KNOWN_MISS = {"Megatron-LM 1.7B, 32 A100": (0.40, 0.70)}


@pytest.mark.parametrize("run", RUNS, ids=lambda r: r.name)
def test_each_run_within_the_error_the_docs_state(run):
    r = project_run(run)
    low, high = KNOWN_MISS.get(run.name, (-STATED, STATED))
    assert low <= r["error"] <= high, f"{run.name}: {r['predicted_tflops']:.1f} against {run.reported_tflops}"
    if run.fitted:
        assert abs(r["error"]) < 0.01


@pytest.mark.parametrize("run", RUNS, ids=lambda r: r.name)
def test_each_layout_is_the_papers(run):
    """The layout's degrees multiply to the GPUs, and its batch is the paper's global batch."""
    cfg = run_config(run)
    p = cfg.parallel
    assert run.layout.data * p.tensor * p.pipeline * p.context == run.ranks == p.world_size
    assert cfg.train.global_batch % (run.layout.data * run.layout.micro_batches) == 0
    assert run.ranks <= load_cluster(run.cluster).max_ranks


def test_the_efficiency_is_the_fitted_runs():
    fitted = [r for r in RUNS if r.fitted]
    assert len(fitted) == 1
    efficiency = fit_efficiency(fitted[0])
    for name in PUBLISHED_CLUSTERS:
        assert load_cluster(name)["compute.efficiency_max"] == pytest.approx(efficiency, abs=0.001)


def test_the_errors_in_the_docs_are_the_projections():
    """docs/planner.md's table gives each run's predicted TFLOP/s and error as the projection computes."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "planner.md").read_text()
    for run in RUNS:
        r = project_run(run)
        row = next(line for line in doc.splitlines() if line.startswith(f"| {run.name} |"))
        assert f"| {r['predicted_tflops']:.0f} |" in row and f"{r['error']:+.1%}" in row, row


@pytest.mark.parametrize("name", PUBLISHED_CLUSTERS)
def test_every_figure_says_where_it_comes_from(name):
    assert_every_figure_cites(name, find_cluster(name).read_text(), SOURCES)
