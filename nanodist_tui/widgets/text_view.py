"""A Static whose redraws stay local: `show(text)` repaints the widget alone, and asks Textual for a layout
(which re-arranges and repaints the whole screen) only when the text's height in rows changed.

Why: `Static.update` lays out the screen on every call. A header or pane redrawn a few times a second then
re-composes every widget on screen each time — most of what the workbench's UI thread spent on a 4-rank
run, and on the threads backend that time is taken from the ranks (they share the GIL).
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.text import Text
from textual.widgets import Static


def rows(text: Text, width: int, wrap: bool = True) -> int:
    """Rows `text` takes in `width` cells: one per line, more for a long line that wraps."""
    lines = text.plain.split("\n")
    if not wrap:
        return len(lines)
    width = max(width, 1)
    return sum(max(1, -(-cell_len(line) // width)) for line in lines)


class TextView(Static):
    # True: the text never gets shorter on screen (padded to the tallest so far), so a pane whose lines come
    # and go (a slow link, a straggler) does not lay out the screen each time; for panes of a fixed size,
    # where only the scroll range depends on the text's height.
    KEEP_HEIGHT = False

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._shown: Text | None = None
        self._shown_rows = -1
        self.shows = 0  # how many times the text changed (and was painted)

    def show(self, text: Text) -> None:
        """Paint `text` unless it is what is shown already; a layout only when its height changes."""
        if self._shown is not None and text == self._shown:
            return
        self._shown = text
        height = rows(text, self.content_region.width or 80, wrap=self.styles.text_wrap != "nowrap")
        if self.KEEP_HEIGHT and height < self._shown_rows:
            text = text + "\n" * (self._shown_rows - height)
            height = self._shown_rows
        self.update(text, layout=height != self._shown_rows)
        self._shown_rows = height
        self.shows += 1
