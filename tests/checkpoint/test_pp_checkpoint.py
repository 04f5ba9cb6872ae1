"""Checkpoints of pipeline-parallel runs: each stage's rank writes its run of the model's parameters, so the
checkpoint consolidates to the dense model's arrays. A crash and resume continues bitwise (DP 2 × PP 2,
ZeRO-1, dropout, tied embeddings; 1F1B and interleaved, whose chunks are joined on one rank); a run saved at
PP 2 resumes at PP 1, PP 4, PP 2 × TP 2 or interleaved (loading then saving gives back the saved bits;
training on matches the uninterrupted run within 1e-10 in float64)."""
from __future__ import annotations

import pytest

from engine.checkpoint.sharded import find_checkpoint
from engine.run.job import resume_training
from tests.run_helpers import (
    assert_resumes_in,
    assert_same_state,
    crashed_run,
    only_run,
    state_at,
    step_losses,
    train,
)

PP2 = ["parallel.world_size=4", "parallel.pipeline=2", "parallel.zero_stage=1", "model.dropout=0.1",
       "model.n_layer=4", "train.micro_batches=2"]
FP64 = ["precision.dtype=fp64", "model.n_layer=4", "model.dropout=0.1", "model.n_head=2",
        "train.micro_batches=2"]


INTERLEAVED = [*PP2, 'parallel.schedule="interleaved"', "parallel.chunks=2"]


@pytest.mark.parametrize("sets", [PP2, INTERLEAVED], ids=["1f1b", "interleaved"])
def test_resume_after_a_crash_continues_bitwise_identically(tmp_path, monkeypatch, sets):
    _, full = train(tmp_path / "a", *sets)
    crashed = crashed_run(tmp_path / "b", monkeypatch, *sets)
    manifest = find_checkpoint(crashed).manifest
    ranges = [e["range"] for e in manifest["shards"]]
    if sets is PP2:  # each rank its ZeRO-1 share of its stage's run: together the whole model
        assert all(ranges) and ranges[0][0] == 0 and max(r[1] for r in ranges) == manifest["numel"]
    else:  # chunks are several runs: the first pipeline rank writes them joined
        assert ranges == [[0, manifest["numel"]], None, None, None]

    resumed: list = []
    summary = resume_training(crashed, on_event=resumed.append)
    assert step_losses(resumed) == {s: v for s, v in step_losses(full).items() if s > 2}  # bitwise
    assert_same_state(state_at(summary["run_dir"]), state_at(only_run(tmp_path / "a")))


@pytest.mark.parametrize("other", [["parallel.world_size=1", "parallel.pipeline=1"],
                                   ["parallel.world_size=4", "parallel.pipeline=4"],
                                   ["parallel.world_size=4", "parallel.pipeline=2", "parallel.tensor=2"],
                                   ["parallel.world_size=2", "parallel.pipeline=2", "parallel.chunks=2",
                                    'parallel.schedule="interleaved"']],
                         ids=["pp1", "pp4", "pp2-tp2", "interleaved"])
def test_resume_at_another_pipeline_degree(tmp_path, other):
    saved = [*FP64, "parallel.world_size=2", "parallel.pipeline=2"]
    original, events = train(tmp_path / "a", *saved, "train.steps=8", "checkpoint.every=4")
    assert_resumes_in(original["run_dir"], other, events)


def test_a_resumed_run_evaluates_with_the_restored_tied_head(tmp_path):
    """The last stage's copy of the tied embedding is no optimizer state: a run resumed at PP 2 evaluates,
    before its first step, with the restored weights, as a one-device resume of the same checkpoint does."""
    original, _ = train(tmp_path / "a", *FP64, "parallel.world_size=2", "parallel.pipeline=2",
                        "train.steps=4", "checkpoint.every=4")
    vals = []
    for layout in (["parallel.world_size=1", "parallel.pipeline=1"],
                   ["parallel.world_size=2", "parallel.pipeline=2"]):
        events: list = []
        resume_training(original["run_dir"], [*layout, "train.steps=5"], step=4, on_event=events.append)
        vals.append([e.val_loss for e in events if e.kind == "eval"][0])
    assert vals[1] == pytest.approx(vals[0], rel=1e-12)
