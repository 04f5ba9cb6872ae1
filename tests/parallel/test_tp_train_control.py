"""Stop and pause reach every rank of a tensor-parallel mesh alike (DP 2 x TP 2 with SP, thread ranks): a
stop asked for mid-run ends every rank after the same step with a checkpoint there (each TP shard saved),
which resumes to the end; a pause holds every rank after the same step and the run then goes on to the end."""

from __future__ import annotations

import threading

from engine.checkpoint.sharded import find_checkpoint
from engine.run.job import resume_training, run_training
from tests.run_helpers import step_losses, tiny_config

TP = ["parallel.world_size=4", "parallel.tensor=2", "parallel.sequence_parallel=true", "model.n_head=4",
      "parallel.zero_stage=2", "train.steps=8", "checkpoint.every=0"]


def test_a_stop_ends_every_rank_after_the_same_step_and_resumes(tmp_path):
    cfg, doc = tiny_config(tmp_path, *TP)
    stop = threading.Event()

    def on_event(e):
        if e.kind == "step_end" and e.step == 2:
            stop.set()
    summary = run_training(cfg, on_event=on_event, stop_event=stop, preset_doc=doc)
    assert summary["stopped"] and 2 <= summary["steps"] < 8
    ckpt = find_checkpoint(summary["run_dir"])
    assert ckpt.step == summary["steps"] and ckpt.manifest["tensor"] == 2
    resumed: list = []
    more = resume_training(summary["run_dir"], on_event=resumed.append)
    assert more["steps"] == 8 and sorted(step_losses(resumed)) == list(range(summary["steps"] + 1, 9))


def test_a_pause_holds_every_rank_and_the_run_goes_on(tmp_path):
    cfg, doc = tiny_config(tmp_path, *TP)
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
