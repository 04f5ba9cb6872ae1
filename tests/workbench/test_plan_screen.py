"""The plan screen (palette: "Plan a layout"): the planner over the run's preset on a cluster, at 80x24;
a new world size searches again; a bad one is one line; escape closes it; `s` starts the highlighted layout
here, scaled down."""

from __future__ import annotations

import asyncio

import pytest
from textual.widgets import DataTable, Input, Select, Static

from nanodist_tui.app import create_app
from nanodist_tui.screens.plan import PlanScreen
from nanodist_tui.shots import replay_app, settle
from tests.app_helpers import SMALL, TEST_PANE_INTERVAL_S, FakeJob, demo_events, wait_for

pytestmark = pytest.mark.slow  # whole screens drawn, searches on worker threads


def _plan_screen(app) -> PlanScreen:
    assert isinstance(app.screen, PlanScreen)
    return app.screen


async def _searched(pilot, cluster: str, ranks: int) -> PlanScreen:
    screen = _plan_screen(pilot.app)
    await wait_for(pilot, lambda: (screen.result or {}).get("requested") == (cluster, ranks), timeout=60)
    await pilot.pause(0.3)
    return screen


def test_plan_screen_snapshot(snap_compare):
    async def show(pilot) -> None:
        await settle(pilot.app, pilot)
        pilot.app.action_plan()
        await pilot.pause(0.2)
        await _searched(pilot, "h100-ndr", 8)

    assert snap_compare(replay_app(demo_events()), terminal_size=SMALL, run_before=show)


def test_a_new_world_size_searches_again_and_escape_closes():
    asyncio.run(_new_world_size())


async def _new_world_size() -> None:
    app = replay_app(demo_events())
    async with app.run_test(size=SMALL) as pilot:
        await settle(app, pilot)
        app.action_plan()
        await pilot.pause(0.2)
        screen = await _searched(pilot, "h100-ndr", 8)
        table = screen.query_one("#plan-table", DataTable)
        assert table.row_count == len(screen.result["ranked"]) >= 1
        ranks = screen.query_one("#plan-ranks", Input)
        ranks.value = "4"
        await ranks.action_submit()
        screen = await _searched(pilot, "h100-ndr", 4)
        assert screen.result["ranks"] == 4
        ranks.value = "0"
        await ranks.action_submit()
        await pilot.pause(0.1)
        assert "not a whole number >= 1" in str(screen.query_one("#plan-status", Static).render())
        screen.query_one("#plan-cluster", Select).value = "a100-hdr"
        await _searched(pilot, "a100-hdr", 4)
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, PlanScreen))


def test_start_starts_the_highlighted_layout_here_scaled_down():
    """The highlighted layout starts here scaled down (the model and ranks plan --validate uses), as a new
    run does."""
    asyncio.run(_start())


async def _start() -> None:
    started: list = []
    job = FakeJob(steps=0, then="wait_for_stop")
    app = create_app("gpt-mini", job, pane_interval_s=TEST_PANE_INTERVAL_S,
                     make_job=lambda cfg, doc: started.append(cfg) or FakeJob(steps=0, then="wait_for_stop"))
    async with app.run_test(size=SMALL) as pilot:
        await wait_for(pilot, lambda: app.workspace is not None)
        app.action_plan()
        await pilot.pause(0.2)
        screen = await _searched(pilot, "h100-ndr", 8)
        first = screen.result["ranked"][0]["layout"]
        await pilot.press("s")
        await pilot.pause(0.3)
        if app.session is not None and app.session.active:  # a run going: the app asks to stop it first
            await pilot.press("y")
        await wait_for(pilot, lambda: bool(started), timeout=20)
        cfg = started[0]
        assert cfg.parallel.backend == "processes" and cfg.parallel.world_size == 2
        assert (cfg.parallel.tensor, cfg.parallel.pipeline, cfg.parallel.context) == \
            (first["tensor"], first["pipeline"], first["context"])
        job.go.set()
