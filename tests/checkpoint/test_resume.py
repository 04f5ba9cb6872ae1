"""Resuming from checkpoints: bitwise-identical continuation after an interruption (threads and processes),
resharding to another world size and ZeRO stage, exact consolidation, retention."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from engine.checkpoint.files import checkpoint_dirs
from engine.checkpoint.sharded import Checkpointer, find_checkpoint
from engine.comm.launch import run_ranks
from engine.config import from_dict, to_dict
from engine.run.job import resume_training
from engine.trainer import Trainer
from tests.run_helpers import (
    TINY,
    assert_same_state,
    crashed_run,
    only_run,
    state_at,
    step_losses,
    tiny_config,
    train,
)

FLAVOURS = {
    "fp32-dropout": ["model.dropout=0.1", "train.micro_batches=2"],
    "fp16-dynamic": ["precision.dtype=fp16", "precision.growth_interval=2", "precision.init_scale=1024.0"],
}


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_resume_after_a_crash_continues_bitwise_identically(tmp_path, monkeypatch, flavour):
    sets = ["parallel.world_size=2", *FLAVOURS[flavour]]
    _, full = train(tmp_path / "a", *sets)

    crashed = crashed_run(tmp_path / "b", monkeypatch, *sets)

    resumed: list = []
    summary = resume_training(crashed, on_event=resumed.append)
    expected = {s: v for s, v in step_losses(full).items() if s > 2}
    assert step_losses(resumed) == expected  # == on floats: bitwise
    scales = [(e.step, e.loss_scale) for e in full if e.kind == "step_end" and e.step > 2]
    assert [(e.step, e.loss_scale) for e in resumed if e.kind == "step_end"] == scales
    assert_same_state(state_at(summary["run_dir"]), state_at(only_run(tmp_path / "a")))


_KILL_AT_CHECKPOINT = """
import json, os, signal, sys
from engine.config import presets
from engine.run.job import run_training
cfg, doc, _ = presets.load_preset("quickstart", json.loads(sys.argv[1]))
def on_event(e):
    if e.kind == "checkpoint_saved" and e.step == 2:
        os.kill(os.getpid(), signal.SIGKILL)  # the launcher dies; its rank processes follow
run_training(cfg, on_event=on_event, preset_doc=doc)
"""


@pytest.mark.slow
def test_resume_after_sigkill_continues_bitwise_identically_processes(tmp_path):
    sets = ["parallel.world_size=2", "parallel.backend=processes", "model.dropout=0.1", "train.steps=8"]
    _, full = train(tmp_path / "a", *sets)
    overrides = [*TINY, f"run.out_dir={tmp_path / 'b'}", *sets]
    killed = subprocess.run([sys.executable, "-c", _KILL_AT_CHECKPOINT, json.dumps(overrides)], cwd=tmp_path,
                            capture_output=True, text=True, timeout=180)
    assert killed.returncode == -9, killed.stderr
    interrupted = only_run(tmp_path / "b")
    ckpt = find_checkpoint(interrupted)
    assert 2 <= ckpt.step < 8

    resumed: list = []
    summary = resume_training(interrupted, on_event=resumed.append)
    assert step_losses(resumed) == {s: v for s, v in step_losses(full).items() if s > ckpt.step}
    assert_same_state(state_at(summary["run_dir"]), state_at(only_run(tmp_path / "a")))


@pytest.mark.parametrize("saved, loaded", [((4, 0), (2, 0)), ((4, 2), (2, 3)), ((2, 3), (4, 1))],
                         ids=["N4-to-N2", "N4-stage2-to-N2-stage3", "N2-stage3-to-N4-stage1"])
def test_resume_at_another_world_size_and_stage(tmp_path, saved, loaded):
    (n_a, stage_a), (n_b, stage_b) = saved, loaded
    original, _ = train(tmp_path / "a", f"parallel.world_size={n_a}", f"parallel.zero_stage={stage_a}",
                        "train.steps=4", "checkpoint.every=0")
    reshard = [f"parallel.world_size={n_b}", f"parallel.zero_stage={stage_b}"]

    # Loading then saving at once (no steps) gives back exactly the saved state, resharded twice.
    same = resume_training(original["run_dir"], [*reshard, "train.steps=4"])
    assert_same_state(state_at(same["run_dir"]), state_at(original["run_dir"]))

    # And training goes on from there: the loss keeps falling.
    events: list = []
    more = resume_training(original["run_dir"], [*reshard, "train.steps=12"], on_event=events.append)
    assert sorted(step_losses(events)) == list(range(5, 13))
    assert all(np.isfinite(list(step_losses(events).values())))
    assert more["final_val_loss"] < original["final_val_loss"]
    started = next(e for e in events if e.kind == "run_started")
    assert started.world_size == n_b and started.config["parallel"]["zero_stage"] == stage_b


HYBRID_2X2 = ["parallel.world_size=4", "parallel.ranks_per_node=2", "parallel.hybrid=true"]


@pytest.mark.parametrize("saved, loaded", [
    (["parallel.world_size=4", "parallel.zero_stage=2"], [*HYBRID_2X2, "parallel.zero_stage=3"]),
    ([*HYBRID_2X2, "parallel.zero_stage=1"], ["parallel.world_size=2", "parallel.zero_stage=0",
                                             "parallel.hybrid=false", "parallel.ranks_per_node=0"]),
], ids=["flat-stage2-to-hybrid-stage3", "hybrid-stage1-to-N2-DDP"])
def test_resume_reshards_to_and_from_hybrid_sharding(tmp_path, saved, loaded):
    """A hybrid checkpoint holds one node's shards (the other node's are the same and not written);
    consolidating gives the full state, whichever way it was sharded."""
    original, _ = train(tmp_path / "a", *saved, "train.steps=4", "checkpoint.every=0")
    same = resume_training(original["run_dir"], [*loaded, "train.steps=4"])
    assert_same_state(state_at(same["run_dir"]), state_at(original["run_dir"]))
    events: list = []
    more = resume_training(original["run_dir"], [*loaded, "train.steps=8"], on_event=events.append)
    assert sorted(step_losses(events)) == list(range(5, 9))
    assert more["final_val_loss"] < original["final_val_loss"]


def _train_and_keep_state(comm, emit, cfg_dict, ckpt_dir):
    cfg = from_dict(cfg_dict)
    trainer = Trainer(cfg, comm, emit)
    trainer.checkpoints = Checkpointer(ckpt_dir, every=0, keep=1, config=cfg_dict)
    try:
        trainer.fit()
        params = {name: p.data.copy() for name, p in trainer.model.named_parameters()}
        return {"range": trainer.replica.owned_range(), "state": trainer.replica.optimizer_state(),
                "params": params}
    finally:
        trainer.replica.close()


FP16 = ["precision.dtype=fp16", "precision.init_scale=1024.0"]


@pytest.mark.parametrize("sets", [["parallel.zero_stage=0"], ["parallel.zero_stage=2"],
                                  ["parallel.zero_stage=0", *FP16]],
                         ids=["stage0", "stage2", "stage0-fp16"])
def test_consolidation_reproduces_the_exact_fp32_parameters(tmp_path, sets):
    cfg, _ = tiny_config(tmp_path, "parallel.world_size=2", *sets)
    ranks = run_ranks(2, "threads", _train_and_keep_state, args=(to_dict(cfg), str(tmp_path / "checkpoints")))
    ckpt = find_checkpoint(tmp_path / "checkpoints")
    full = ckpt.consolidate()
    numel = ckpt.manifest["numel"]
    for rank in ranks:  # every rank's live fp32 state is exactly its slice of the consolidated arrays
        start, end = rank["range"]
        for key in ("master", "m", "v"):
            live = rank["state"][key][:max(0, min(end, numel) - start)]
            assert live.tobytes() == full[key][start:start + len(live)].tobytes(), key
    offset = 0
    for name, value in ranks[0]["params"].items():  # and the model's parameters are the master, rounded
        n = value.size
        assert value.tobytes() == full["master"][offset:offset + n].astype(value.dtype).tobytes(), name
        offset += n
    assert offset == numel


def test_retention_keeps_the_last_k_checkpoints(tmp_path):
    summary, events = train(tmp_path, "train.steps=5", "checkpoint.every=1", "checkpoint.keep=2")
    run_dir = only_run(tmp_path)
    assert [s for s, _ in checkpoint_dirs(run_dir / "checkpoints")] == [4, 5]
    assert [e.step for e in events if e.kind == "checkpoint_saved"] == [1, 2, 3, 4, 5]
    assert find_checkpoint(run_dir).step == 5
