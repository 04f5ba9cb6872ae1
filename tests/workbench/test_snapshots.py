"""Snapshots (pytest-textual-snapshot) of the workbench replaying the bundled demo recording with no pauses:
the main screen, each pane's tab, the help, every other screen and dialog and the sweep pane, at 80x24 and
160x50. Deterministic: recorded events, no clock
on screen. After a deliberate change of the picture:
pytest tests/workbench/test_snapshots.py --snapshot-update."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.events import RunFinished
from nanodist_tui.app import create_app
from nanodist_tui.compare import figures
from nanodist_tui.shots import replay_app, settle
from tests.app_helpers import (
    SIZE,
    SMALL,
    TEST_PANE_INTERVAL_S,
    FakeJob,
    FakeSweep,
    demo_events,
    demo_run_folder,
    wait_for,
)
from tests.context_run_helpers import context_run
from tests.expert_run_helpers import moe_run
from tests.pipeline_helpers import pipeline_run

# Whole screens drawn many times over: out of the quick subset (`-m "not slow"`), in the full suite.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]

TABS = {1: "overview", 2: "curves", 3: "memory", 4: "traffic", 5: "ranks", 6: "loss-scale", 7: "log"}


@pytest.mark.parametrize("size", [SMALL, SIZE], ids=["80x24", "160x50"])
@pytest.mark.parametrize("tab", list(TABS), ids=list(TABS.values()))
def test_each_tab(snap_compare, tab, size):
    async def show(pilot) -> None:
        await settle(pilot.app, pilot, tab)

    assert snap_compare(replay_app(demo_events()), terminal_size=size, run_before=show)


@pytest.mark.parametrize("size", [SMALL, SIZE], ids=["80x24", "160x50"])
def test_pipeline_tab(snap_compare, size):
    """A recorded dp 2 x pp 4 GPipe run (tests/pipeline_helpers.py): rank 0's pipeline, its bubble beside the
    formula's, the next-pipeline key in the footer."""
    app = replay_app(pipeline_run(world=8))

    async def show(pilot) -> None:
        await settle(pilot.app, pilot)
        await settle(pilot.app, pilot, pilot.app.workspace.tab_ids.index("tab-pipeline") + 1)

    assert snap_compare(app, terminal_size=size, run_before=show)


@pytest.mark.parametrize("size", [SMALL, SIZE], ids=["80x24", "160x50"])
def test_experts_tab(snap_compare, size):
    """A recorded 8-expert top-2 run on EP 4 (tests/expert_run_helpers.py): its last step, a balanced layer
    and one whose last EP rank receives nothing."""
    app = replay_app(moe_run())

    async def show(pilot) -> None:
        await settle(pilot.app, pilot)
        await settle(pilot.app, pilot, pilot.app.workspace.tab_ids.index("tab-experts") + 1)

    assert snap_compare(app, terminal_size=size, run_before=show)


@pytest.mark.parametrize("size", [SMALL, SIZE], ids=["80x24", "160x50"])
def test_context_tab(snap_compare, size):
    """A recorded DP 2 x CP 2 run, contiguous layout (tests/context_run_helpers.py): each rank's blocks and
    scores, the second rank of each pair twice the first's, busiest/mean 1.33."""
    app = replay_app(context_run())

    async def show(pilot) -> None:
        await settle(pilot.app, pilot)
        await settle(pilot.app, pilot, pilot.app.workspace.tab_ids.index("tab-context") + 1)

    assert snap_compare(app, terminal_size=size, run_before=show)


@pytest.mark.parametrize("size", [SMALL, SIZE], ids=["80x24", "160x50"])
def test_help(snap_compare, size):
    async def show(pilot) -> None:
        await settle(pilot.app, pilot)
        await pilot.press("question_mark")
        await pilot.pause(0.2)

    assert snap_compare(replay_app(demo_events()), terminal_size=size, run_before=show)


# ---------------------------------------------------------------- screens and dialogs
# Each screen at both sizes, from fixed inputs: the demo recording (replayed, or as two runs to compare, or as
# a run folder to open), the bundled presets, and fake jobs that hold still where the picture is taken.

SIZES = pytest.mark.parametrize("size", [SMALL, SIZE], ids=["80x24", "160x50"])




@SIZES
def test_projection_screen(snap_compare, size):
    async def show(pilot) -> None:
        await settle(pilot.app, pilot)
        await pilot.press("j")
        await pilot.pause(0.2)
        projection = pilot.app.projection
        projection.result = None
        projection.query_one("#projection-cluster").value = "a100-hdr"  # a cluster's figures, fixed
        # the cluster's own result, not one a worker for the screen's first cluster still delivers
        await wait_for(pilot, lambda: (projection.result or {}).get("requested") == "a100-hdr"
                       and bool(projection.result["rows"]), timeout=30)
        await pilot.pause(0.5)

    assert snap_compare(replay_app(demo_events()), terminal_size=size, run_before=show)


@SIZES
def test_compare_screen(snap_compare, size):
    events = demo_events()
    first_half = [e for e in events if getattr(e, "step", 0) <= 30 and not isinstance(e, RunFinished)]
    runs = (figures(events, "demo"), figures(first_half, "demo-first-half"))
    app = create_app("compare", None, compare=runs, pane_interval_s=TEST_PANE_INTERVAL_S)

    async def show(pilot) -> None:
        await pilot.pause(0.8)

    assert snap_compare(app, terminal_size=size, run_before=show)


@SIZES
def test_new_run_screen(snap_compare, size, monkeypatch):
    """The form over a run that has not stepped yet (a replay offers no new run), on the bundled presets."""
    monkeypatch.chdir(REPO)
    app = create_app("fake", FakeJob(steps=0, then="wait_for_stop"), pane_interval_s=TEST_PANE_INTERVAL_S,
                     make_job=lambda cfg, doc: FakeJob(steps=0, then="wait_for_stop"))

    async def show(pilot) -> None:
        await wait_for(pilot, lambda: app.workspace is not None)
        await pilot.press("n")
        await pilot.pause(0.8)

    assert snap_compare(app, terminal_size=size, run_before=show)


@SIZES
def test_open_run_screen(snap_compare, size, tmp_path, monkeypatch):
    demo_run_folder(tmp_path)
    monkeypatch.chdir(tmp_path)

    async def show(pilot) -> None:
        await settle(pilot.app, pilot)
        await pilot.press("o")
        await pilot.pause(0.4)

    assert snap_compare(replay_app(demo_events()), terminal_size=size, run_before=show)


@SIZES
def test_sweeps_screen(snap_compare, size, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no sweep stored: the screen says so

    async def show(pilot) -> None:
        await settle(pilot.app, pilot)
        pilot.app.action_sweeps()
        await pilot.pause(0.4)

    assert snap_compare(replay_app(demo_events()), terminal_size=size, run_before=show)


@SIZES
@pytest.mark.parametrize("key", ["s", "q"], ids=["stop", "quit"])
def test_dialogs_over_a_live_run(snap_compare, size, key):
    """The stop and quit questions, asked over a 2-rank run that holds after its last step."""
    job = FakeJob(steps=3, world_size=2, then="wait_for_stop", pace_s=0.0)
    app = create_app("fake", job, pane_interval_s=TEST_PANE_INTERVAL_S)

    async def show(pilot) -> None:
        await wait_for(pilot, lambda: app.session is not None and app.header.latest is not None
                       and app.header.latest.step == 3)
        await pilot.pause(0.3)
        app.redraw_now()
        await pilot.press(key)
        await pilot.pause(0.4)
        app.redraw_now()  # the header's held state drawn now, not at its next timed redraw (a loaded machine)
        await pilot.pause(0.2)

    try:
        assert snap_compare(app, terminal_size=size, run_before=show)
    finally:
        job.go.set()


@SIZES
def test_sweep_pane(snap_compare, size):
    job = FakeSweep(n=4)
    app = create_app("fake", job, sweep_finish=job.finish, pane_interval_s=TEST_PANE_INTERVAL_S)

    async def show(pilot) -> None:
        await wait_for(pilot, lambda: app.session is not None and app.session.state == "finished")
        for _ in range(3):
            await pilot.pause(0.15)
            app.redraw_now()
        await pilot.pause(0.2)

    assert snap_compare(app, terminal_size=size, run_before=show)
