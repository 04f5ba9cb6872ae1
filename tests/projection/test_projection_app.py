"""The workbench's projection screen, driven by Textual's Pilot with a fake run and a calibration fixture:
`j` opens it, the table and the live comparison fill in, another cluster can be picked, `escape` returns."""

from __future__ import annotations

import asyncio
import threading
import time

from projection_helpers import fixture_calibration, small_config
from textual.widgets import DataTable, Input, Select, Static

from engine.config import to_dict
from engine.events import RunStarted, StepEnd
from nanodist_tui.app import create_app
from tests.app_helpers import TEST_PANE_INTERVAL_S

SIZE = (160, 50)


class Job:
    """A 2-rank run of the SMALL model: RunStarted, then steps of 40 ms until stopped."""

    def __init__(self):
        self.cfg = small_config(parallel={"world_size": 2})

    def __call__(self, emit, stop: threading.Event) -> None:
        emit(RunStarted(run_id="r", preset="small", config=to_dict(self.cfg), n_params=1, world_size=2,
                        total_steps=1000))
        step = 0
        while not stop.is_set():
            emit(StepEnd(step=step, loss=1.0, lr=1e-3, tokens=1024, step_time_s=0.04, tokens_per_s=25600.0,
                         grad_norm=1.0))
            step += 1
            time.sleep(0.02)


async def wait_for(pilot, condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await pilot.pause(0.05)


def live_text(app) -> str:
    return str(app.screen.query_one("#projection-live", Static).content)


def test_projection_screen_shows_the_scaling_and_the_live_comparison(in_tmp, monkeypatch):
    monkeypatch.setenv("NANODIST_CALIBRATION", str(in_tmp / "calibration.json"))
    fixture_calibration(in_tmp / "calibration.json")
    app = create_app("small", Job(), pane_interval_s=TEST_PANE_INTERVAL_S)

    async def scenario(pilot) -> None:
        await pilot.pause(0.3)
        await pilot.press("j")
        table = app.screen.query_one(DataTable)
        await wait_for(pilot, lambda: table.row_count == 4)  # 1, 2, 4, 8 ranks fit this machine's file
        await wait_for(pilot, lambda: "measured here 40.0 ms/step" in live_text(app))
        text = live_text(app)
        assert "this machine (calibrated): 2 rank(s) predicted" in text and "error" in text
        app.screen.query_one(Select).value = "a100-hdr"
        await wait_for(pilot, lambda: table.row_count == 11)  # 1 ... 1024 ranks
        await wait_for(pilot, lambda: "8x A100 nodes" in live_text(app))
        assert "error" not in live_text(app)  # another machine's prediction is not held to this one's run
        await pilot.press("escape")
        await pilot.pause(0.1)
        assert app.screen.query("#workspace")  # back on the run's panes

    async def main() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await scenario(pilot)

    asyncio.run(main())


def test_without_a_calibration_the_screen_says_how_to_make_one(in_tmp, monkeypatch):
    monkeypatch.setenv("NANODIST_CALIBRATION", str(in_tmp / "none.json"))
    app = create_app("small", Job(), pane_interval_s=TEST_PANE_INTERVAL_S)

    async def main() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause(0.3)
            await pilot.press("j")
            await wait_for(pilot, lambda: "press c to measure it" in live_text(app))

    asyncio.run(main())


def test_nccl_tests_fit_from_the_projection_screen(in_tmp, monkeypatch):
    from projection_helpers import nccl_table
    monkeypatch.setenv("NANODIST_CALIBRATION", str(in_tmp / "calibration.json"))
    fixture_calibration(in_tmp / "calibration.json")
    table = in_tmp / "allreduce.txt"
    table.write_text(nccl_table(10e-6, 1 / 200e9, 8, [8 << k for k in range(0, 25, 3)]))
    app = create_app("small", Job(), pane_interval_s=TEST_PANE_INTERVAL_S)

    def tools() -> str:
        return str(app.screen.query_one("#projection-tools", Static).content)

    async def main() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause(0.3)
            await pilot.press("j")
            for path, expected in ((table, "latency_us = 10.0, bandwidth_gbs = 200.0"),
                                   (in_tmp / "missing", "No such file")):
                await pilot.press("n")
                field = app.screen.query_one("#projection-nccl", Input)
                assert field.display and field.has_focus
                field.value = str(path)
                await pilot.press("enter")
                await wait_for(pilot, lambda expected=expected: expected in tools())
                assert not field.display

    asyncio.run(main())
