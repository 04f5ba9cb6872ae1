"""Nothing the workbench shows is cut, at 80x24 and at 160x50: every DataTable's columns are all in view and
each cell fits its column whole; every text table (a Static or text view of aligned lines) fits its box
without a wrapped or cut line; nowhere an ellipsis. Walked over every tab and every screen."""

from __future__ import annotations

import asyncio

import pytest
from rich.text import Text
from textual.screen import Screen
from textual.widgets import DataTable, Static

from nanodist_tui.app import create_app
from nanodist_tui.compare import figures
from nanodist_tui.shots import replay_app, settle
from nanodist_tui.widgets.projection_pane import COLUMNS, SHORT_COLUMNS, headers_for, table_rows
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

# Whole screens drawn many times over: out of the quick subset (`-m "not slow"`), in the full suite.
pytestmark = pytest.mark.slow

SIZES = pytest.mark.parametrize("size", [SMALL, SIZE], ids=["80x24", "160x50"])


def cut_cells(screen: Screen) -> list[str]:
    """What is cut on the screen, one line each: a DataTable wider than its view (columns out of sight), a
    cell longer than its column, a text line longer than its box (wrapped or cut)."""
    found = []
    for table in screen.query(DataTable):
        if not table.display or not table.region.width:
            continue
        view = table.scrollable_content_region.width
        if table.virtual_size.width > view:
            name = table.id or type(table).__name__
            found.append(f"{name}: {table.virtual_size.width} cells wide in {view}")
        for column in table.columns.values():
            room = column.content_width if column.auto_width else column.width
            for row_key in table.rows:
                cell = table.get_cell(row_key, column.key)
                text = cell if isinstance(cell, Text) else Text(str(cell))
                if text.cell_len > room:
                    found.append(f"{table.id}: {text.plain!r} in a column {room} wide")
    for widget in screen.query(Static):
        if not widget.display or not widget.region.width or widget.styles.text_wrap != "nowrap":
            continue
        width = widget.content_region.width
        content = widget.visual
        plain = getattr(content, "plain", None) or str(getattr(widget, "content", ""))
        for line in plain.splitlines():
            if Text(line).cell_len > width:
                found.append(f"{widget.id or type(widget).__name__}: {line.strip()!r} longer than {width}")
    return found


def run_and_check(app, size, show) -> list[str]:
    found: list[str] = []

    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await show(pilot)
            # a table between its rows and its next layout (columns not yet widened) is not a cut: what
            # stays on screen is, so a few looks a moment apart must all find it
            for _ in range(3):
                await pilot.pause(0.2)
                ellipsis = "…" in app.export_screenshot()
                now = cut_cells(app.screen) + (["an ellipsis on screen"] if ellipsis else [])
                if not now:
                    break
            found.extend(now)

    asyncio.run(main())
    return found


@SIZES
@pytest.mark.parametrize("tab", range(1, 9))
def test_no_tab_cuts_a_figure(size, tab):
    async def show(pilot) -> None:
        await settle(pilot.app, pilot, tab)

    assert run_and_check(replay_app(demo_events()), size, show) == []


@SIZES
@pytest.mark.parametrize("key", ["j", "o"])
def test_no_screen_cuts_a_figure(size, key, tmp_path, monkeypatch):
    demo_run_folder(tmp_path)
    monkeypatch.chdir(tmp_path)

    async def show(pilot) -> None:
        await settle(pilot.app, pilot)
        await pilot.press(key)
        await pilot.pause(0.2)
        if key == "j":
            projection = pilot.app.projection
            projection.result = None
            projection.query_one("#projection-cluster").value = "a100-hdr"
            await wait_for(pilot, lambda: bool((projection.result or {}).get("rows")), timeout=30)
            await pilot.pause(0.5)

    assert run_and_check(replay_app(demo_events()), size, show) == []


@SIZES
def test_compare_cuts_no_figure(size):
    events = demo_events()
    runs = (figures(events, "demo"), figures(events[: len(events) // 2], "demo-first-half"))
    app = create_app("compare", None, compare=runs, pane_interval_s=TEST_PANE_INTERVAL_S)

    async def show(pilot) -> None:
        await pilot.pause(0.8)

    assert run_and_check(app, size, show) == []


@SIZES
def test_the_sweep_pane_cuts_no_figure(size):
    job = FakeSweep(n=4)
    app = create_app("fake", job, sweep_finish=job.finish, pane_interval_s=TEST_PANE_INTERVAL_S)

    async def show(pilot) -> None:
        while app.session is None or app.session.state != "finished":
            await pilot.pause(0.05)
        await pilot.pause(0.3)
        app.redraw_now()
        await pilot.pause(0.3)

    assert run_and_check(app, size, show) == []


def test_the_projection_table_heads_its_columns_shorter_only_where_the_long_headers_do_not_fit():
    row = {"world_size": 1024, "step_s": 0.5551, "compute_s": 4e-5, "overlapped_s": 1e-5, "exposed_s": 0.555,
           "comm_share": 1.0, "tokens_per_s": 944_123.0, "scaling_efficiency": 0.001, "mfu": 0.0001,
           "peak_bytes": 11.5e6, "fits": True}
    cells = table_rows([row])
    assert cells == [("1024", "555", "0.04", "0.01", "555", "100%", "944k", "0%", "0.0%", "11.5", "yes")]
    assert headers_for(cells, 94) == COLUMNS and headers_for(cells, 76) == SHORT_COLUMNS
    assert headers_for([], 94) == COLUMNS  # no rows yet (an uncalibrated machine): the long headers


@SIZES
@pytest.mark.parametrize("tab", [1, 4])
def test_a_two_rank_all_reduce_run_cuts_no_figure(size, tab):
    """ZeRO-0 on 2 ranks: the traffic pane's all-reduce line and its definitions (the demo is ZeRO-2)."""
    job = FakeJob(steps=3, world_size=2, then="wait_for_stop", pace_s=0.0)
    app = create_app("fake", job, pane_interval_s=TEST_PANE_INTERVAL_S)

    async def show(pilot) -> None:
        await wait_for(pilot, lambda: app.header.latest is not None and app.header.latest.step == 3)
        app.action_show_tab(tab)
        for _ in range(3):
            await pilot.pause(0.15)
            app.redraw_now()

    try:
        assert run_and_check(app, size, show) == []
    finally:
        job.go.set()


def test_short_forms_keep_three_digits_and_the_unit_in_six_cells():
    from nanodist_tui.widgets.units import short_bytes, short_seconds
    assert [short_seconds(s) for s in (0.0056, 0.039, 0.6957, 1.114, 12.34, 123.4)] == [
        "5.6ms", "39ms", "696ms", "1.11s", "12.3s", "123s"]
    assert [short_bytes(n) for n in (5, 331_100, 3.6e6, 12.5e6, 125e6, 1.5e9)] == [
        "5B", "331kB", "3.60MB", "12.5MB", "125MB", "1.50GB"]
    assert all(len(short_bytes(n)) <= 6 for n in (999, 9_999, 99_999, 999_499, 99.99e9))
    assert all(len(short_seconds(s)) <= 6 for s in (0.00999, 0.9999, 9.999, 99.99, 999.9))


def test_the_projection_says_what_to_do_where_there_is_nothing_to_project(tmp_path, monkeypatch):
    """On this machine without a calibration, one box says why there is no projection and what to do (press
    c, or another cluster) instead of an empty plot and an empty table; another cluster brings them back."""
    monkeypatch.setenv("NANODIST_CALIBRATION", str(tmp_path / "none.json"))
    app = replay_app(demo_events())

    async def show(pilot) -> None:
        await settle(app, pilot)
        await pilot.press("j")
        projection = app.projection
        await wait_for(pilot, lambda: "error" in (projection.result or {}), timeout=30)
        empty = projection.query_one("#projection-empty", Static)
        await wait_for(pilot, lambda: empty.display and empty.region.height > 0)  # shown once laid out
        assert not projection.query_one("#projection-plot").display
        assert not projection.query_one("#projection-table").display
        said = str(empty.render())
        assert "no calibration of this model" in said and "press c" in said and "h100-ndr" in said
        projection.query_one("#projection-cluster").value = "h100-ndr"
        await wait_for(pilot, lambda: bool((projection.result or {}).get("rows")), timeout=30)
        # the table is filled once the plot has been laid out again (projection_pane.py: _show)
        await wait_for(pilot, lambda: not empty.display
                       and projection.query_one("#projection-table", DataTable).row_count > 0)
        app.exit()

    async def main() -> None:
        async with app.run_test(size=SMALL) as pilot:
            await show(pilot)

    asyncio.run(main())
