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


ROW_STEP = 8  # an overflowing fixed-size pane's text is padded to a multiple of this many rows


class TextView(Static):
    # True for a pane whose size the layout fixes (a share of its row): the height of its text then matters
    # only for the scroll range. While the text fits, its height needs no layout; once it overflows, it is
    # padded to a multiple of ROW_STEP rows, so a line that comes and goes (a slow link, a straggler) does
    # not lay the screen out each time. The padding depends on the text alone: what is drawn does not
    # depend on what was drawn before.
    FIXED_SIZE = False

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._shown: Text | None = None
        self._laid_out_rows = -1  # the text's height at the last layout
        self.shows = 0  # how many times the text changed (and was painted)

    def show(self, text: Text) -> None:
        """Paint `text` unless it is what is shown already; a layout only when its height needs one."""
        if self._shown is not None and text == self._shown:
            return
        self._shown = text
        height = rows(text, self.content_region.width or 80, wrap=self.styles.text_wrap != "nowrap")
        room = self.content_region.height
        layout = height != self._laid_out_rows
        if self.FIXED_SIZE and self._laid_out_rows >= 0:
            if height > room:
                padded = -(-height // ROW_STEP) * ROW_STEP
                text, height = text + "\n" * (padded - height), padded
            layout = height != self._laid_out_rows and max(height, self._laid_out_rows) > room
        self.update(text, layout=layout)
        if layout:
            self._laid_out_rows = height
        self.shows += 1
