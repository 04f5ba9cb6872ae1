"""Checkpoints of context-parallel runs: a crash and resume continues bitwise (DP 2 x CP 2, ZeRO-1 sharded
over the data x context ranks); every CP rank holds the whole model, so a run saved at CP 2 resumes at CP 1,
CP 4 or the other layout (loading then saving gives back the saved bits; training on matches the
uninterrupted run within 1e-10 in float64)."""
from __future__ import annotations

import pytest

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

CP2 = ["parallel.world_size=4", "parallel.context=2", "parallel.zero_stage=1", "model.dropout=0.0"]


def test_resume_after_a_crash_continues_bitwise_identically(tmp_path, monkeypatch):
    _, full = train(tmp_path / "a", *CP2)
    crashed = crashed_run(tmp_path / "b", monkeypatch, *CP2)
    resumed: list = []
    summary = resume_training(crashed, on_event=resumed.append)
    assert step_losses(resumed) == {s: v for s, v in step_losses(full).items() if s > 2}  # bitwise
    assert_same_state(state_at(summary["run_dir"]), state_at(only_run(tmp_path / "a")))


@pytest.mark.parametrize("world, context, layout", [(1, 1, "zigzag"), (4, 4, "zigzag"), (2, 2, "contiguous")],
                         ids=["cp1", "cp4", "contiguous"])
def test_resume_at_another_context_degree(tmp_path, world, context, layout):
    saved = ["precision.dtype=fp64", "model.dropout=0.0", "parallel.world_size=2", "parallel.context=2"]
    original, events = train(tmp_path / "a", *saved, "train.steps=8", "checkpoint.every=4")
    assert_resumes_in(original["run_dir"], [f"parallel.world_size={world}", f"parallel.context={context}",
                                            f"parallel.context_layout={layout}"], events)
