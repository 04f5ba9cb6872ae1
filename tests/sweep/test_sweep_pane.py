"""The workbench on a sweep, driven by Textual's Pilot: the trial table updated in place (cursor kept), best
so far, the history, intermediate values and Pareto plots, `x` ending the sweep after the running trial
through the job's own thread, and a real tiny sweep from start to end."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from nanodist_tui.app import create_app
from nanodist_tui.widgets.pane import Pane
from nanodist_tui.widgets.sweep_pane import SweepPane
from tests.app_helpers import TEST_PANE_INTERVAL_S, FakeSweep
from tests.sweep_helpers import sweep_of, write_preset

# Whole screens drawn many times over: out of the quick subset (`-m "not slow"`), in the full suite.
pytestmark = pytest.mark.slow

SIZE = (160, 50)



async def settle(pilot, app, until, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not until() and time.monotonic() < deadline:
        await pilot.pause(0.05)
    await pilot.pause(0.4)  # one render tick


def test_sweep_pane_is_a_pane_and_only_a_sweep_gets_it():
    assert isinstance(SweepPane(), Pane)

    async def main() -> None:
        app = create_app("plain", lambda emit, stop: None, pane_interval_s=TEST_PANE_INTERVAL_S)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause(0.2)
            assert not app.query(SweepPane)
            assert app.check_action("finish_sweep", ()) is False  # no `x` key outside a sweep
    asyncio.run(main())


def test_trials_fill_the_table_in_place_and_the_cursor_stays():
    job = FakeSweep(n=4, hold_at=2)

    async def main() -> None:
        app = create_app("fake", job, sweep_finish=job.finish, pane_interval_s=TEST_PANE_INTERVAL_S)
        async with app.run_test(size=SIZE) as pilot:
            pane = app.query_one(SweepPane)
            await settle(pilot, app, lambda: len(pane.table.rows) == 2)
            table = pane.table
            table.move_cursor(row=1)
            summary = str(pane.summary.content)
            assert "study fake" in summary and "2/4 trials" in summary and "best 2.6 (trial 1)" in summary
            assert str(table.get_cell("0", "val_loss")) == "3"
            assert str(table.get_cell("1", "state")) == "complete *"
            job.go.set()
            await settle(pilot, app, lambda: app.session.state == "finished")
            assert len(table.rows) == 4 and table.cursor_row == 1  # updated in place: the cursor stayed
            assert [str(table.get_cell(str(n), "val_loss")) for n in range(4)] == ["3", "2.6", "3.2", "2.8"]
            assert str(table.get_cell("1", "state")) == "complete *"  # still the best
            assert pane.history.trials == {0: 3.0, 1: 2.6, 2: 3.2, 3: 2.8}
            assert pane.history.best == {0: 3.0, 1: 2.6, 2: 2.6, 3: 2.6}
            assert pane.intermediate.running[3] == [(2, 3.6), (4, 3.2)]
            assert not pane.pareto.display  # one metric
            assert app.session.state == "finished"  # trials' RunFinished events did not end the app early
    asyncio.run(main())


def test_two_metrics_show_the_pareto_front():
    job = FakeSweep(n=3, metrics=("val_loss", "peak_memory_mb"))

    async def main() -> None:
        app = create_app("fake", job, sweep_finish=job.finish, pane_interval_s=TEST_PANE_INTERVAL_S)
        async with app.run_test(size=SIZE) as pilot:
            pane = app.query_one(SweepPane)
            await settle(pilot, app, lambda: app.session.state == "finished")
            assert pane.pareto.display and pane.pareto.front == [0, 1, 2]
            assert pane.pareto.points == {0: (3.0, 10.0), 1: (2.6, 11.0), 2: (3.2, 12.0)}
            assert "Pareto front: trials 0, 1, 2" in str(pane.summary.content)
    asyncio.run(main())


def test_x_ends_the_sweep_after_the_running_trial_on_the_jobs_thread():
    job = FakeSweep(n=5, hold_at=1)

    async def main() -> None:
        app = create_app("fake", job, sweep_finish=job.finish, pane_interval_s=TEST_PANE_INTERVAL_S)
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot, app, lambda: job.ran == [0])
            assert app.check_action("finish_sweep", ()) is True
            await pilot.press("x")
            assert job.finish.is_set() and not app.session.control.is_set()  # not a stop of the running trial
            job.go.set()
            await settle(pilot, app, lambda: app.session.state == "finished")
            assert job.ran == [0] and job.thread is not threading.main_thread()
            assert app.query_one(SweepPane).finished.stopped
    asyncio.run(main())


def test_a_real_tiny_sweep_in_the_workbench(in_tmp):
    sweep = sweep_of(write_preset(in_tmp, """\
[sweep]
n_trials = 2
sampler = "random"
[sweep.space.optim.lr]
type = "float"
low = 1e-3
high = 3e-2
log = true
"""))
    from engine.sweep.runner import run_sweep
    finish = threading.Event()

    async def main() -> None:
        app = create_app("tiny", lambda emit, stop: run_sweep(sweep, emit, stop, finish), sweep_finish=finish,
                         pane_interval_s=TEST_PANE_INTERVAL_S)
        async with app.run_test(size=SIZE) as pilot:
            pane = app.query_one(SweepPane)
            await settle(pilot, app, lambda: app.session.state == "finished", timeout=60)
            app.redraw_now()  # the pane's last timed redraw may not have come yet on a loaded machine
            assert app.session.state == "finished" and len(pane.table.rows) == 2
            assert {str(pane.table.get_cell(str(n), "state")).split()[0] for n in range(2)} == {"complete"}
            assert len(pane.history.trials) == 2 and pane.intermediate.running  # reports at steps 4, 8, 12
            assert pane.finished is not None and not pane.finished.stopped
    asyncio.run(main())


def test_the_history_axis_counts_whole_trials_from_zero():
    """With two trials plotext alone would label x -0.5, 0.25, ... : the history's ticks are whole trial
    numbers, none negative."""
    job = FakeSweep(n=2)

    async def main() -> None:
        app = create_app("fake", job, sweep_finish=job.finish, pane_interval_s=TEST_PANE_INTERVAL_S)
        async with app.run_test(size=SIZE) as pilot:
            pane = app.query_one(SweepPane)
            await settle(pilot, app, lambda: app.session.state == "finished")
            app.redraw_now()
            await pilot.pause(0.3)
            lines = pane.history.render().plain.splitlines()  # type: ignore[union-attr]
            axis = next(line for line in reversed(lines) if line.strip() and "trial" not in line)
            ticks = axis.split()
            assert ticks and all(t.isdigit() for t in ticks), axis
            assert ticks[0] == "0" and int(ticks[-1]) >= 1
    asyncio.run(main())
