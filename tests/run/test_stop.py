"""Stopping and pausing a multi-rank run: every rank leaves (or holds) after the same step, whatever moment
each one notices; a stopped run keeps a checkpoint at the step it reached and resumes bitwise."""

from __future__ import annotations

import json
import threading
import time

import pytest

from engine.checkpoint.sharded import find_checkpoint
from engine.config.presets import load_preset
from engine.run.control import RunControl
from engine.run.job import resume_training, run_training
from tests.run_helpers import assert_same_state, only_run, state_at, step_losses, tiny_config, train


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["threads", "processes"])
def test_stop_request_ends_every_rank_cleanly(backend):
    cfg, _, _ = load_preset("mlp", ["train.steps=200", "optim.warmup_steps=0", "data.n_samples=2048",
                                    "train.eval_every=0", "parallel.world_size=2", "parallel.bucket_cap_mb=1",
                                    f'parallel.backend="{backend}"'])
    for _ in range(3):  # the race this guards against (one rank evaluating, one sending) is timing-bound
        stop = threading.Event()
        steps = []

        def on_event(e, stop=stop, steps=steps):
            if e.kind == "step_end":
                steps.append(e.step)
                if e.step == 3:
                    stop.set()

        summary = run_training(cfg, on_event=on_event, stop_event=stop, record=False)
        assert summary["stopped"]
        assert 3 <= summary["steps"] < 200
        assert steps == list(range(1, summary["steps"] + 1))


def stop_at(step: int, control: threading.Event, events: list):
    def on_event(e):
        events.append(e)
        if e.kind == "step_end" and e.step == step:
            control.set()
    return on_event


@pytest.mark.parametrize("world", [1, 2])
def test_a_stopped_run_keeps_a_checkpoint_at_its_step_and_resumes_bitwise(tmp_path, world):
    sets = [f"parallel.world_size={world}", "train.steps=8", "checkpoint.every=0", "model.dropout=0.1"]
    _, full = train(tmp_path / "a", *sets)

    cfg, doc = tiny_config(tmp_path / "b", *sets)
    events: list = []
    summary = run_training(cfg, on_event=stop_at(3, control := RunControl(), events), stop_event=control,
                           preset_doc=doc)
    stopped_at = summary["steps"]
    assert summary["stopped"] and 3 <= stopped_at < 8
    run_dir = only_run(tmp_path / "b")
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "stopped"
    assert find_checkpoint(run_dir).step == stopped_at  # no periodic checkpoint: this one is the stop's
    (finished,) = [e for e in events if e.kind == "run_finished"]
    assert finished.stopped and finished.steps == stopped_at

    resumed: list = []
    done = resume_training(run_dir, on_event=resumed.append)
    assert not done["stopped"] and done["steps"] == 8
    assert step_losses(resumed) == {s: v for s, v in step_losses(full).items() if s > stopped_at}
    assert_same_state(state_at(done["run_dir"]), state_at(only_run(tmp_path / "a")))
    started = next(e for e in resumed if e.kind == "run_started")
    assert started.first_step == stopped_at and started.run_dir == done["run_dir"]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["threads", "processes"])
def test_pause_holds_every_rank_after_the_same_step_until_resumed(tmp_path, backend):
    cfg, doc = tiny_config(tmp_path, "parallel.world_size=2", f"parallel.backend={backend}", "train.steps=10")
    control = RunControl()
    events: list = []
    held = threading.Event()

    def on_event(e):
        events.append(e)
        if e.kind == "step_end" and e.step == 3:
            control.pause.set()
        if e.kind == "run_paused" and e.paused:
            held.set()

    def resume_later():
        assert held.wait(60)
        time.sleep(0.6)  # ranks hold: nothing trains meanwhile
        count = sum(1 for e in events if e.kind == "rank_stats")
        time.sleep(0.4)
        assert sum(1 for e in events if e.kind == "rank_stats") == count
        control.pause.clear()

    waiter = threading.Thread(target=resume_later)
    waiter.start()
    summary = run_training(cfg, on_event=on_event, stop_event=control, pause_event=control.pause,
                           preset_doc=doc)
    waiter.join()
    assert summary["steps"] == 10 and not summary["stopped"]
    paused = [(e.step, e.paused) for e in events if e.kind == "run_paused"]
    assert len(paused) == 2 and paused[0][1] and not paused[1][1] and paused[0][0] == paused[1][0]
    hold = paused[0][0]
    assert hold >= 3
    # Both ranks reported exactly the steps up to the hold before it, and the rest after it.
    kinds = [(e.kind, getattr(e, "step", None), getattr(e, "rank", None)) for e in events]
    at = kinds.index(("run_paused", hold, None))
    before = {(s, r) for k, s, r in kinds[:at] if k == "rank_stats"}
    assert before == {(s, r) for s in range(1, hold + 1) for r in (0, 1)}
