"""A RichLog of `describe.Line`s, styled by level; lines queue as ticks arrive and are written on redraw,
so pausing the display freezes the log too. A line may quote a recorded run, so it is written escaped
(engine.run.printable) and as Text, never parsed as markup."""

from __future__ import annotations

from rich.text import Text
from textual.events import Resize
from textual.widgets import RichLog

from engine.run.printable import printable
from nanodist_tui.describe import Line

LEVEL_STYLES = {"debug": "dim", "warning": "yellow", "error": "bold red", "success": "green"}


class LineLog(RichLog):
    def __init__(self, *, id: str | None = None, max_lines: int, classes: str | None = None) -> None:
        super().__init__(id=id, max_lines=max_lines, wrap=True, markup=False, classes=classes)
        self._pending: list[Line] = []

    def queue(self, line: Line) -> None:
        self._pending.append(line)

    def write_queued(self) -> None:
        """Write and forget the queued lines, wrapped to the log's current width (RichLog's default is 78)."""
        if not self.size.width:
            return  # not laid out yet: the lines wait here, to be wrapped at the width the log gets
        if not self._size_known:
            # RichLog holds every write until a Resize tells it its size, and Textual does not always send
            # one to a log laid out while the tab around it is being built (seen under a 1 kHz event
            # stream): it then stays blank for good. Its own Resize handler marks the size known.
            self.on_resize(Resize(self.size, self.virtual_size))
        width = self.scrollable_content_region.width or None
        for line in self._pending:
            self.write(Text(printable(line.text), style=LEVEL_STYLES.get(line.level, "")), width=width)
        self._pending.clear()
