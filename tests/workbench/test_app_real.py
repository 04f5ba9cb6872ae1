"""The workbench on real training jobs: stopping from the keyboard writes a checkpoint at the step reached and
`resume` continues it bitwise; quitting mid-run on the processes backend leaves no rank process or engine
thread behind; every rank's memory and traffic reach the app on the tcp backend too."""

from __future__ import annotations

import json
import multiprocessing
import threading
import time

import pytest

from engine.checkpoint.sharded import find_checkpoint
from engine.run.job import resume_training
from nanodist_tui.app import NanoDistApp
from nanodist_tui.cli.running import training_job
from nanodist_tui.priority import SPAWNER
from tests.app_helpers import run, wait_for
from tests.run_helpers import assert_same_state, only_run, state_at, step_losses, tiny_config, train

SETS = ["parallel.world_size=2", "train.steps=400", "checkpoint.every=0", "model.dropout=0.1"]


@pytest.mark.slow
def test_stopping_in_the_workbench_keeps_a_checkpoint_and_resume_continues_bitwise(tmp_path):
    _, full = train(tmp_path / "a", *SETS)
    cfg, doc = tiny_config(tmp_path / "b", *SETS)

    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.header.latest is not None and app.header.latest.step >= 3,
                       timeout=60)
        await pilot.press("p")  # hold it (a tiny run is over in seconds), then stop it where it holds
        await wait_for(pilot, lambda: app.session.state == "paused", timeout=30)
        await pilot.press("s", "y")
        await wait_for(pilot, lambda: app.session.worker.is_finished, timeout=60)
        await wait_for(pilot, lambda: app.session.state == "stopped")  # the app hears of the end next

    app = run(scenario, training_job(cfg, doc))
    run_dir = only_run(tmp_path / "b")
    summary = json.loads((run_dir / "summary.json").read_text())
    stopped_at = summary["steps"]
    assert summary["status"] == "stopped" and 3 <= stopped_at < 400
    assert find_checkpoint(run_dir).step == stopped_at
    lines = app.farewell()
    assert f"run folder     {run_dir}" in lines and f"continue with  nanodist-tui resume {run_dir}" in lines

    resumed: list = []
    done = resume_training(run_dir, on_event=resumed.append)
    assert step_losses(resumed) == {s: v for s, v in step_losses(full).items() if s > stopped_at}
    assert_same_state(state_at(done["run_dir"]), state_at(only_run(tmp_path / "a")))


@pytest.mark.slow
def test_quitting_mid_run_leaves_no_rank_process_or_engine_thread(tmp_path):
    from multiprocessing import resource_tracker
    resource_tracker.ensure_running()
    cfg, doc = tiny_config(tmp_path, "parallel.world_size=2", "parallel.backend=processes",
                           "train.steps=10000")
    before = set(threading.enumerate())

    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.header.latest is not None, timeout=90)
        assert len(multiprocessing.active_children()) >= 2  # the rank processes
        await pilot.press("q", "y")
        await wait_for(pilot, lambda: not app.is_running, timeout=90)

    app = run(scenario, training_job(cfg, doc))
    deadline = time.monotonic() + 10
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert multiprocessing.active_children() == []
    left = [t for t in set(threading.enumerate()) - before if t.is_alive() and not t.daemon]
    # The spawner (nanodist_tui.priority) stays, idle, for the process's next workbench; no job thread does.
    assert left == [] and not [t for t in threading.enumerate()
                               if t.name.startswith("nanodist-") and t.name != SPAWNER]
    run_dir = only_run(tmp_path)
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "stopped"
    assert app.farewell()[0].startswith("steps ")
