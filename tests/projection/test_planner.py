"""The planner against its references: the config rules (every layout it ranks is one a run accepts), the
projection (its predictions are project.predict's, its bounds are below them, its branch and bound ranks
what a brute-force projection of every layout ranks) and the estimator (its memory bounds are below the
estimate; what it says does not fit, the estimator says does not fit)."""

from __future__ import annotations

import dataclasses

import pytest

from engine.config import from_dict, to_dict
from engine.config.presets import load_preset
from engine.memory.estimator import estimate
from engine.memory.pipeline import estimate_ranks
from engine.projection.clusters import load_cluster
from engine.projection.planner import TIE, _Judge, plan
from engine.projection.planner_space import MAX_MICRO_BATCHES, apply, layouts, micro_batch_choices, problem
from engine.projection.project import predict


@pytest.fixture(scope="module")
def mini():
    return load_preset("gpt-mini")[0]


@pytest.fixture(scope="module")
def h100():
    return load_cluster("h100-ndr")


@pytest.fixture(scope="module")
def report(mini, h100):
    return plan(mini, h100, 8, top=5)


def test_every_ranked_layout_is_one_a_run_accepts(report, mini):
    assert len(report["ranked"]) == 5
    for cand in report["ranked"]:
        cfg = apply(mini, cand.layout, 8)
        d = to_dict(cfg)
        from_dict(d)  # the config rules, as `nanodist-tui run` applies them: raises on a refused layout
        lay = cand.layout
        assert lay.data * lay.tensor * lay.pipeline * lay.context == 8
        assert cfg.train.global_batch == mini.train.global_batch  # the same batch for every layout


def test_predictions_are_the_projections_and_ranked_fastest_first(report, mini, h100):
    steps = [c.step.step_s for c in report["ranked"]]
    assert steps == sorted(steps)
    for cand in report["ranked"]:
        step, mem, _ = predict(apply(mini, cand.layout, 8), h100)
        assert cand.step.step_s == pytest.approx(step.step_s, rel=1e-12)
        assert cand.peak_bytes == sum(mem.peak()[1].values())
        split = cand.split()
        assert sum(split.values()) == pytest.approx(step.step_s, rel=1e-9)  # the split adds up to the step


def test_every_other_layout_has_one_reason(report):
    verdicts = {c.verdict for c in report["rest"]}
    assert verdicts <= {"slower", "does not fit", "refused", "not evaluated"}
    assert all(c.why for c in report["rest"])
    assert report["counts"]["layouts"] == len(report["ranked"]) + len(report["rest"])


def test_bounds_are_below_the_projection(mini, h100):
    """Every layout's compute-and-bubble bound under its projected step, over the whole space of 4 ranks."""
    judge = _Judge(mini, h100, 4, 0.0, None)
    checked = 0
    for layout in layouts(mini, 4, judge.params * 4):
        cfg = apply(mini, layout, 4)
        if problem(cfg) is not None or layout.bucket_mb != 25.0 or layout.order != "tp-cp-ep-dp-pp":
            continue
        try:
            step, _, _ = predict(cfg, h100)
        except ZeroDivisionError:  # context x pipeline: the projection's rows per micro-batch
            continue
        assert judge.bound(layout) <= step.step_s * (1 + 1e-9), layout.label()
        checked += 1
    assert checked > 50


def test_memory_bounds_are_below_the_estimate(mini, h100):
    judge = _Judge(mini, h100, 4, 0.0, None)
    checked = 0
    for layout in layouts(mini, 4, judge.params * 4):
        cfg = apply(mini, layout, 4)
        if problem(cfg) is not None or layout.bucket_mb != 25.0:
            continue
        states, activations = judge.memory_bound(layout)
        ranks = estimate_ranks(cfg) if layout.pipeline > 1 else [estimate(cfg)]
        assert states <= max(sum(e.states.values()) for e in ranks), layout.label()
        heaviest = max(sum(e.peak()[1].values()) for e in ranks)
        least = states + activations if layout.pipeline == 1 else max(states, activations)
        assert least <= heaviest, layout.label()
        checked += 1
    assert checked > 50


@pytest.mark.slow  # every accepted layout of 4 ranks projected: about half a minute
def test_branch_and_bound_ranks_what_brute_force_ranks(mini, h100):
    """The top 3 of 4 ranks by the search against every accepted layout projected, ties of one shape (a
    bucket size or ZeRO stage that changes nothing) counted once, as the search counts them."""
    found = plan(mini, h100, 4, top=3)
    judge = _Judge(mini, h100, 4, 0.0, None)
    every = []
    for layout in layouts(mini, 4, judge.params * 4):
        cfg = apply(mini, layout, 4)
        if problem(cfg) is None:
            try:
                every.append((predict(cfg, h100)[0].step_s, layout.shape))
            except ZeroDivisionError:  # context x pipeline: the planner leaves it "not evaluated" too
                continue
    kept: list = []
    for step, shape in sorted(every, key=lambda e: e[0]):
        if not any(k_shape == shape and abs(k - step) <= TIE * k for k, k_shape in kept):
            kept.append((step, shape))
    assert [c.step.step_s for c in found["ranked"]] == pytest.approx([k for k, _ in kept[:3]], rel=1e-9)


def test_micro_batches_fill_the_pipeline_and_reach_one_row_each():
    """Without a pipeline 1, 2, 4; with p stages the fewest divisors of the rows at or above p, 2p, 4p, and
    the rows themselves (one row each), at most MAX_MICRO_BATCHES (BLOOM's replica of 256 rows over 12
    stages loses its 256: docs/planner.md says what that costs)."""
    assert MAX_MICRO_BATCHES == 64
    assert micro_batch_choices(256, 1) == [1, 2, 4]
    assert micro_batch_choices(6, 1) == [1, 2]
    assert micro_batch_choices(256, 12) == [16, 32, 64]
    assert micro_batch_choices(6, 4) == [6]
    assert micro_batch_choices(24, 2) == [2, 4, 8, 24]  # 8 divides 24, and no divisor lies between 8 and 24
    assert micro_batch_choices(512, 40) == [64]  # 128, 256 and 512 lie past the cap


def test_a_small_memory_per_rank_leaves_nothing_that_fits_and_says_which_category(mini, h100):
    r = plan(mini, h100, 8, memory_per_rank=1e6)
    assert r["ranked"] == []
    unfit = [c for c in r["rest"] if c.verdict == "does not fit"]
    assert unfit and all("GB" in c.why and "hold the most" in c.why for c in unfit)
    for c in unfit[:20]:  # the estimator agrees
        assert sum(estimate(apply(mini, c.layout, 8)).peak()[1].values()) > 1e6


@pytest.mark.slow  # tens of seconds on a loaded 2-core machine: each estimate of a 146B model's rank ~0.2 s
def test_a_large_model_is_searched_to_the_end():
    """A 146B model on 256 A100s: the search ends before its budget (every layout judged or bounded), and
    what it ranks fits the 80 GB a GPU has."""
    cfg = load_preset("presets/published/megatron-146b.toml")[0]
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, global_batch=512))
    r = plan(cfg, load_cluster("selene-a100"), 256, top=3, budget_s=300)
    assert r["ranked"] and not any("ran out" in c.why for c in r["rest"])
    assert all(c.peak_bytes <= 80e9 for c in r["ranked"])
