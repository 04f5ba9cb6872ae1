"""Pick recorded runs from a folder of run folders (newest first, with their key figures): one to replay, or
two to compare."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Static

from engine.run.printable import printable
from engine.run.recorder import list_runs
from nanodist_tui.widgets.footer import WorkbenchFooter
from nanodist_tui.widgets.table_columns import add_fitted_columns

COLUMNS = ("", "run", "status", "steps", "val loss", "tok/s")


def _figure(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


class OpenRunScreen(Screen[list[Path] | None]):
    BINDINGS = [Binding("space", "mark", "Mark", id="runs-mark"),
                Binding("enter", "choose", "Open", id="runs-open", priority=True),
                Binding("escape", "cancel", "Cancel", id="runs-cancel")]

    def __init__(self, count: int, out_dir: str | Path = "runs") -> None:
        super().__init__()
        self.count, self.out_dir = count, Path(out_dir)
        self.runs = list_runs(self.out_dir)
        self.marked: list[Path] = []

    def compose(self) -> ComposeResult:
        what = ("a run to replay: enter" if self.count == 1
                else "two runs to compare: space marks, enter opens")
        yield Static(f"Pick {what}  ({self.out_dir}/)", id="open-run-title")
        table: DataTable = DataTable(cursor_type="row", zebra_stripes=True, id="runs")
        # a str cell is read as markup: the recorded names go in as escaped Text
        rows = [(Text(""), Text(printable(info.run_id)), Text(printable(info.status)),
                 Text(_figure(info.steps, "d")), Text(_figure(info.final_val_loss, ".4f"), justify="right"),
                 Text(_figure(info.tokens_per_s, ",.0f"), justify="right")) for info in self.runs]
        # the mark column, empty at first, holds one digit once a run is marked
        add_fitted_columns(table, COLUMNS, rows, keys=[label or "mark" for label in COLUMNS], min_width=1)
        for info, row in zip(self.runs, rows, strict=True):
            table.add_row(*row, key=str(info.run_dir))
        if not self.runs:
            yield Static(f"no recorded runs in {self.out_dir}/: train one first (n starts a run)",
                         id="no-runs")
        yield table
        yield WorkbenchFooter()

    def _current(self) -> Path | None:
        table = self.query_one(DataTable)
        if not self.runs:
            return None
        return self.runs[table.cursor_row].run_dir

    def action_mark(self) -> None:
        run = self._current()
        if run is None:
            return
        table = self.query_one(DataTable)
        if run in self.marked:
            self.marked.remove(run)
        elif len(self.marked) < self.count:
            self.marked.append(run)
        table.update_cell(str(run), "mark", str(self.marked.index(run) + 1) if run in self.marked else "")

    def action_choose(self) -> None:
        run = self._current()
        chosen = list(self.marked)
        if run is not None and run not in chosen and len(chosen) < self.count:
            chosen.append(run)
        if len(chosen) == self.count:
            self.dismiss(chosen)
        elif run is not None:
            self.notify(f"mark {self.count} runs with space, then enter")

    def action_cancel(self) -> None:
        self.dismiss(None)
