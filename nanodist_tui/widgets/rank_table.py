"""Per-rank timing and traffic: one row per rank, cells updated in place."""

from __future__ import annotations

from textual.widgets import DataTable

from engine.events import RankStats
from nanodist_tui.messages import Tick
from nanodist_tui.widgets.units import format_bytes, format_seconds

COLUMNS = (
    ("rank", "rank"),
    ("step", "step"),
    ("step_time", "step time"),
    ("comm_wait", "comm wait"),
    ("wait_share", "wait %"),
    ("bytes_sent", "bytes sent"),
)


class RankTable(DataTable):
    """Hidden until a run with more than one rank starts (the app shows it)."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self.border_title = "ranks"
        self.stats: dict[int, RankStats] = {}
        self._shown: dict[int, RankStats] = {}

    def on_mount(self) -> None:
        for key, label in COLUMNS:
            self.add_column(label, key=key)

    def add_ranks(self, world_size: int) -> None:
        for rank in range(world_size):
            self._ensure_row(rank)

    def ingest(self, tick: Tick) -> None:
        self.stats.update(tick.rank_stats)

    def redraw(self) -> None:
        if not self.is_on_screen:
            return
        for rank, stats in sorted(self.stats.items()):
            if self._shown.get(rank) is stats:
                continue
            self._ensure_row(rank)
            share = stats.comm_wait_s / stats.step_time_s if stats.step_time_s > 0 else 0.0
            values = {
                "step": str(stats.step),
                "step_time": format_seconds(stats.step_time_s),
                "comm_wait": format_seconds(stats.comm_wait_s),
                "wait_share": f"{share:.0%}",
                "bytes_sent": format_bytes(stats.bytes_sent),
            }
            for column, value in values.items():
                # In place: clear() would reset the cursor and the scroll position.
                self.update_cell(str(rank), column, value)
            self._shown[rank] = stats

    def _ensure_row(self, rank: int) -> None:
        if str(rank) not in self.rows:
            self.add_row(str(rank), *("-" for _ in COLUMNS[1:]), key=str(rank))
