"""Fixtures shared by the test modules (test modules never import each other; shared helpers live in
comm_helpers.py, parallel_helpers.py and run_helpers.py)."""

from __future__ import annotations

import pytest


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run in a fresh temporary folder, seeing only the shipped presets (no ./presets, no
    NANODIST_PRESETS): what a user gets on a new machine."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NANODIST_PRESETS", raising=False)
    return tmp_path


@pytest.fixture
def workbench(monkeypatch):
    """Run the workbench a command opens under Textual's test driver until its run ends; what it showed."""
    import asyncio
    import time

    from nanodist_tui.app import NanoDistApp
    from nanodist_tui.widgets.log_pane import LogPane
    seen: dict = {}

    def run_until_done(self: NanoDistApp) -> None:
        async def main() -> None:
            async with self.run_test(size=(160, 50)) as pilot:
                deadline = time.monotonic() + 30
                while (self.session is None or self.session.active) and time.monotonic() < deadline:
                    await pilot.pause(0.05)
                await pilot.pause(0.4)  # one render tick after the last event
                self.redraw_now()  # the log tab writes what it queued only when drawn
                logs = [pane for pane in self.panes if isinstance(pane, LogPane)]
                seen.update(state=self.session.state, header=str(self.header.content),
                            replay=self.session.replay,
                            log="\n".join(line.text for log in logs[:1] for line in log.lines))
                await pilot.press("q")
        asyncio.run(main())

    monkeypatch.setattr(NanoDistApp, "run", run_until_done)
    return seen
