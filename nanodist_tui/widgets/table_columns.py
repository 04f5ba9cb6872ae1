"""A DataTable's columns at fixed widths, each the widest of its cells and its header. Textual's DataTable
widens an auto-width column only once its message queue is idle, which a loaded machine may not reach
before the next frame: a column then shows a cell narrow (seen in CI snapshots), or, where every cell is
empty at first, not at all."""

from __future__ import annotations

from collections.abc import Sequence

from rich.cells import cell_len
from rich.text import Text
from textual.widgets import DataTable


def add_fitted_columns(table: DataTable, headers: Sequence[str], rows: Sequence[Sequence[str | Text]],
                       keys: Sequence[str] | None = None, min_width: int = 0) -> None:
    """Add `headers` as `table`'s columns (with `keys`, if given), each as wide as its widest cell in `rows`
    or its header, and at least `min_width` (room for a cell filled in later)."""
    for i, header in enumerate(headers):
        cells = [row[i] for row in rows]
        widths = [cell.cell_len if isinstance(cell, Text) else cell_len(cell) for cell in cells]
        width = max([min_width, cell_len(header), *widths])
        table.add_column(header, key=keys[i] if keys else None, width=width)
