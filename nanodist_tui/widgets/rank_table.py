"""Per-rank step figures: one row per rank, cells right-aligned and updated in place (the cursor and the
scroll position stay where the user put them). Figures in their short forms (696ms, 331kB) and columns as
wide as their content, so every column, peak memory included, fits in 80 columns."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from engine.events import RankStats
from nanodist_tui.messages import Tick
from nanodist_tui.run_info import RunInfo
from nanodist_tui.widgets.units import format_share, short_bytes, short_seconds

# (key, label): what each column means is in the help screen (screens/help.py). Widths follow the content.
COLUMNS = (
    ("rank", "rank"),
    ("step", "step"),
    ("step_time", "step"),
    ("compute", "compute"),
    ("comm", "comm"),
    ("wait", "wait"),
    ("wait_share", "wait %"),
    ("sent", "sent/step"),
    ("memory", "peak mem"),
)


def _right(text: str) -> Text:
    return Text(text, justify="right")


class RankTable(DataTable):
    def __init__(self, info: RunInfo, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self.border_title = "ranks"
        self.info = info
        self.stats: dict[int, RankStats] = {}
        self.comm_s: dict[int, float] = {}
        self.memory_peak: dict[int, int] = {}
        self._shown: dict[int, tuple] = {}

    def on_mount(self) -> None:
        for key, label in COLUMNS:
            self.add_column(_right(label), key=key)
        for rank in range(self.info.world_size):
            self.add_row(*(_right("-") if k != "rank" else _right(str(rank)) for k, _ in COLUMNS),
                         key=str(rank))

    def ingest(self, tick: Tick) -> None:
        self.stats.update(tick.rank_stats)
        for rank, traffic in tick.traffic.items():
            self.comm_s[rank] = sum(link["seconds"] for link in traffic.links)
        for (rank, _), snap in tick.memory.items():
            self.memory_peak[rank] = max(self.memory_peak.get(rank, 0), sum(snap.peak.values()))

    def redraw(self) -> None:
        if not self.is_on_screen:
            return
        for rank, stats in sorted(self.stats.items()):
            figures = (stats, self.comm_s.get(rank), self.memory_peak.get(rank))
            if self._shown.get(rank) == figures:
                continue
            if str(rank) not in self.rows:  # a rank beyond the run's world size: show it all the same
                self.add_row(*(_right("-") for _ in COLUMNS), key=str(rank))
            comm = self.comm_s.get(rank)
            memory = self.memory_peak.get(rank)
            values = {
                "rank": str(rank),
                "step": str(stats.step),
                "step_time": short_seconds(stats.step_time_s),
                "compute": short_seconds(max(0.0, stats.step_time_s - stats.comm_wait_s)),
                "comm": "-" if comm is None else short_seconds(comm),
                "wait": short_seconds(stats.comm_wait_s),
                "wait_share": format_share(stats.comm_wait_s, stats.step_time_s),
                "sent": short_bytes(stats.bytes_sent),
                "memory": "-" if memory is None else short_bytes(memory),
            }
            for column, value in values.items():
                # In place: clear() would reset the cursor and the scroll position.
                # update_width: a column grows with a longer figure rather than cut it.
                self.update_cell(str(rank), column, _right(value), update_width=True)
            self._shown[rank] = figures
