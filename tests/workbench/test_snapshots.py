"""Snapshots (pytest-textual-snapshot) of the workbench replaying the bundled demo recording with no pauses:
the main screen, each pane's tab and the help, at 80x24 and 160x50. Deterministic: recorded events, no clock
on screen. After a deliberate change of the picture:
pytest tests/workbench/test_snapshots.py --snapshot-update."""

from __future__ import annotations

import pytest

from nanodist_tui.shots import replay_app, settle
from tests.app_helpers import SIZE, SMALL, demo_events

TABS = {1: "overview", 2: "curves", 3: "memory", 4: "traffic", 5: "ranks", 6: "loss-scale", 7: "log"}


@pytest.mark.parametrize("size", [SMALL, SIZE], ids=["80x24", "160x50"])
@pytest.mark.parametrize("tab", list(TABS), ids=list(TABS.values()))
def test_each_tab(snap_compare, tab, size):
    async def show(pilot) -> None:
        await settle(pilot.app, pilot, tab)

    assert snap_compare(replay_app(demo_events()), terminal_size=size, run_before=show)


@pytest.mark.parametrize("size", [SMALL, SIZE], ids=["80x24", "160x50"])
def test_help(snap_compare, size):
    async def show(pilot) -> None:
        await settle(pilot.app, pilot)
        await pilot.press("question_mark")
        await pilot.pause(0.2)

    assert snap_compare(replay_app(demo_events()), terminal_size=size, run_before=show)
