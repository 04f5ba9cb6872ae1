"""The workbench's first frame: the run's panes laid out from its config before the run has started (no jump
when RunStarted comes), and the stage the run is in said in the header until the first step."""

from __future__ import annotations

import threading

from engine.events import Phase
from nanodist_tui.app import NanoDistApp
from nanodist_tui.run_info import RunInfo
from tests.app_helpers import N_PARAMS, FakeJob, config, header_text, run, wait_for


class SlowStart(FakeJob):
    """A 2-rank fp16 run that says it is starting its ranks, then waits for `started` before RunStarted."""

    def __init__(self) -> None:
        super().__init__(steps=3, world_size=2)
        self.started = threading.Event()

    def __call__(self, emit, control):
        emit(Phase("starting ranks"))
        self.started.wait(10)
        return super().__call__(emit, control)


def test_the_panes_are_there_before_the_run_starts_and_stay_where_they_are():
    job = SlowStart()
    shape = RunInfo.from_config(config(2, "fp16"), "fake")

    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: "starting ranks" in header_text(app))
        assert app.workspace is not None and app.session.info is None  # laid out, not yet started
        before = app.workspace.tab_ids
        assert [t.removeprefix("tab-") for t in before] == [
            "overview", "curves", "memory", "traffic", "ranks", "loss-scale", "log", "mesh"]
        await pilot.press("3")  # the user looks at memory while the ranks start
        await pilot.pause(0.1)
        assert app.workspace.active_tab == "tab-memory"
        job.started.set()
        await wait_for(pilot, lambda: app.session.state == "finished")
        assert app.workspace.info.n_params == N_PARAMS  # the run's own panes, with its figures
        assert app.workspace.tab_ids == before and app.workspace.active_tab == "tab-memory"
        assert "starting ranks" not in header_text(app)  # steps came: the stage is no longer news

    run(scenario, job, shape=shape)


def test_a_shape_from_the_config_matches_the_one_run_started_brings():
    info = RunInfo.from_config({**config(4, "bf16", zero_stage=2), "train": {"steps": 50}}, "p")
    shape = (info.world_size, info.dtype, info.zero_stage, info.total_steps, info.preset)
    assert shape == (4, "bf16", 2, 50, "p")
