"""Checkpoints of tensor-parallel runs: a crash and resume continues bitwise (DP 2 x TP 2 with sequence
parallelism, ZeRO-1, dropout); the checkpoint consolidates to the dense model's arrays whatever degree saved
it, so a run resumes at TP 1 or TP 4 (loading then saving gives back the saved bits; training on matches
the uninterrupted TP 2 run within 1e-10 in float64); `export` writes the dense model; damaged tensor fields
are one line each."""
from __future__ import annotations

import json

import numpy as np
import pytest

from engine.checkpoint.export import export_model, load_model
from engine.checkpoint.files import MANIFEST, CheckpointError, read_manifest
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

TP2 = ["parallel.world_size=4", "parallel.tensor=2", "parallel.sequence_parallel=true",
       "parallel.zero_stage=1", "model.dropout=0.1", "model.n_head=4"]
FP64 = ["precision.dtype=fp64", "model.n_head=4", "model.dropout=0.1"]


def test_resume_after_a_crash_continues_bitwise_identically(tmp_path, monkeypatch):
    _, full = train(tmp_path / "a", *TP2)
    crashed = crashed_run(tmp_path / "b", monkeypatch, *TP2)
    manifest = find_checkpoint(crashed).manifest
    assert manifest["tensor"] == 2 and [e["tp"] for e in manifest["shards"]] == [0, 1, 0, 1]

    resumed: list = []
    summary = resume_training(crashed, on_event=resumed.append)
    assert step_losses(resumed) == {s: v for s, v in step_losses(full).items() if s > 2}  # bitwise
    assert_same_state(state_at(summary["run_dir"]), state_at(only_run(tmp_path / "a")))


@pytest.mark.parametrize("world, tensor", [(1, 1), (4, 4), (2, 1)], ids=["tp1", "tp4", "dp2"])
def test_resume_at_another_tensor_degree(tmp_path, world, tensor):
    """Saved by DP 2 x TP 2 (SP), resumed at TP 1, TP 4 (SP) or DP 2 without TP: loading and saving at once
    gives back the saved bits; and the next steps' losses are the uninterrupted run's (float64)."""
    saved = [*FP64, "parallel.world_size=4", "parallel.tensor=2", "parallel.sequence_parallel=true"]
    original, events = train(tmp_path / "a", *saved, "train.steps=8", "checkpoint.every=4")
    other = [f"parallel.world_size={world}", f"parallel.tensor={tensor}",
             f"parallel.sequence_parallel={'true' if tensor > 1 else 'false'}"]
    same = assert_resumes_in(original["run_dir"], other, events)
    assert find_checkpoint(same["run_dir"]).manifest["tensor"] == tensor


def test_export_consolidates_to_the_dense_model(tmp_path):
    """A TP 2 run's export holds the whole model: the same parameters a one-device run of the same config
    exports (float64 training, exported as float32)."""
    tp, _ = train(tmp_path / "tp", *FP64, "parallel.world_size=2", "parallel.tensor=2", "train.steps=3")
    one, _ = train(tmp_path / "one", *FP64, "train.steps=3")
    models = [load_model(export_model(find_checkpoint(r["run_dir"]), tmp_path / f"{i}.npz"))
              for i, r in enumerate((tp, one))]
    pairs = zip(models[0].named_parameters(), models[1].named_parameters())
    for (name, a), (other, b) in pairs:
        assert name == other
        np.testing.assert_allclose(a.data, b.data, rtol=1e-6, atol=1e-7)
    assert models[0].wte.weight.shape == (models[0].vocab_size, 32)  # the whole vocabulary, no padding


@pytest.mark.parametrize("edit, text", [
    (lambda m: m.update(tensor=3), "tensor: 3 does not divide world_size 4"),
    (lambda m: m["shards"][1].update(tp=2), "shards[1].tp: 2 is out of range [0, 1]"),
    (lambda m: m["shards"][1].update(tp=0), "gap or overlap"),
])
def test_a_damaged_tensor_field_is_one_line(tmp_path, edit, text):
    original, _ = train(tmp_path, *TP2, "train.steps=2", "checkpoint.every=0")
    folder = find_checkpoint(original["run_dir"]).path
    manifest = json.loads((folder / MANIFEST).read_text())
    edit(manifest)
    (folder / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError) as info:
        read_manifest(folder)
    assert text in str(info.value) and "\n" not in str(info.value), str(info.value)
