"""Stop and pause reach every rank of a mesh alike, whatever splits the model (thread ranks): a stop asked
for mid-run ends every rank after the same step with a checkpoint there (every shard or stage saved), which
resumes to the end; a pause holds every rank after the same step and the run then goes on to the end.
Layouts: DP 2 x TP 2 with SP and ZeRO-2; DP 2 x PP 2 with ZeRO-1."""

from __future__ import annotations

import threading

import pytest

from engine.checkpoint.sharded import find_checkpoint
from engine.run.job import resume_training, run_training
from tests.run_helpers import step_losses, tiny_config

COMMON = ["parallel.world_size=4", "train.steps=8", "checkpoint.every=0"]
LAYOUTS = {
    "tp": ["parallel.tensor=2", "parallel.sequence_parallel=true", "model.n_head=4", "parallel.zero_stage=2"],
    "pp": ["parallel.pipeline=2", "parallel.zero_stage=1", "model.n_layer=2", "train.micro_batches=2"],
}
SPLIT = {"tp": ("tensor", 2), "pp": ("pipeline", 2)}  # the checkpoint's config says how it was split


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_stop_ends_every_rank_after_the_same_step_and_resumes(tmp_path, layout):
    cfg, doc = tiny_config(tmp_path, *COMMON, *LAYOUTS[layout])
    stop = threading.Event()

    def on_event(e):
        if e.kind == "step_end" and e.step == 2:
            stop.set()
    summary = run_training(cfg, on_event=on_event, stop_event=stop, preset_doc=doc)
    assert summary["stopped"] and 2 <= summary["steps"] < 8
    ckpt = find_checkpoint(summary["run_dir"])
    key, degree = SPLIT[layout]
    assert ckpt.step == summary["steps"] and ckpt.manifest["config"]["parallel"][key] == degree
    resumed: list = []
    more = resume_training(summary["run_dir"], on_event=resumed.append)
    assert more["steps"] == 8 and sorted(step_losses(resumed)) == list(range(summary["steps"] + 1, 9))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_pause_holds_every_rank_and_the_run_goes_on(tmp_path, layout):
    cfg, doc = tiny_config(tmp_path, *COMMON, *LAYOUTS[layout])
    pause = threading.Event()
    events: list = []

    def on_event(e):
        events.append(e)
        if e.kind == "step_end" and e.step == 2 and not pause.is_set():
            pause.set()
            threading.Timer(0.5, pause.clear).start()
    summary = run_training(cfg, on_event=on_event, pause_event=pause, preset_doc=doc)
    assert summary["steps"] == 8 and not summary["stopped"]
    held = [(e.step, e.paused) for e in events if e.kind == "run_paused"]
    assert held[0][1] and not held[-1][1] and held[0][0] == held[-1][0] >= 2
    assert sorted(step_losses(events)) == list(range(1, 9))
