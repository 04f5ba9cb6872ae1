"""Run log: one line per discrete engine event, plus the app's own messages (errors, stop, pause)."""

from __future__ import annotations

from nanodist_tui.describe import Line, describe
from nanodist_tui.messages import Tick
from nanodist_tui.run_info import RunInfo
from nanodist_tui.widgets.line_log import LineLog


class LogPane(LineLog):
    def __init__(self, info: RunInfo | None = None, *, id: str | None = None) -> None:
        super().__init__(id=id, max_lines=2000)
        self.border_title = "log"

    def ingest(self, tick: Tick) -> None:
        for event in tick.events:
            if (line := describe(event)) is not None:
                self.queue(line)

    def add(self, text: str, level: str = "info") -> None:
        """One of the app's own messages, shown on the next redraw like an event's line."""
        self.queue(Line(text, level))

    def redraw(self) -> None:
        self.write_queued()
