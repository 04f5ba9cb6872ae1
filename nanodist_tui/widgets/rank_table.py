"""Per-rank step figures: one row per rank, cells right-aligned and updated in place (the cursor and the
scroll position stay where the user put them). Figures in their short forms (696ms, 331kB), in columns of
fixed widths, the widest figure's or the heading's, so every column, peak memory included, fits in 80 columns,
and no column moves as figures change. (Widths that follow the content were path-dependent: DataTable widens a
column only once its message queue goes idle, which a loaded machine may not reach before the next frame, and
a figure was cut: "4.0m".)

Where the mesh has more than one axis (degree > 1), the rank column also gives the rank's coordinates, each
under its axis's name ("rank dp tp" over "   3  1  1"), or its initial from three axes on ("rank d p t"
over "   5 0 1 1"): one column, not one per axis, so a layout of three axes still fits 80 columns."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from engine.events import RankStats
from engine.parallel.mesh import Mesh
from nanodist_tui.mesh_grid import rank_coords, shown_axes
from nanodist_tui.messages import Tick
from nanodist_tui.run_info import RunInfo
from nanodist_tui.widgets.units import format_share, short_bytes, short_seconds

# (key, label, the widest figure): what each column means is in the help screen (screens/help.py). The
# rank's and the step's widths come from the run (its layout, its number of steps).
SECONDS, BYTES, SHARE = 5, 6, 4  # "696ms", "1.11s" (6 only from 10,000 s); "3.61MB"; "100%"
COLUMNS = (
    ("rank", "rank", 0),
    ("step", "step", 0),
    ("step_time", "step", SECONDS),
    ("compute", "compute", SECONDS),
    ("comm", "comm", SECONDS),
    ("wait", "wait", SECONDS),
    ("wait_share", "wait %", SHARE),
    ("sent", "sent/step", BYTES),
    ("memory", "peak mem", BYTES),
)


def _right(text: str) -> Text:
    return Text(text, justify="right")


class RankPlaces:
    """The rank column's heading and cells: the rank alone, or with its coordinates on every axis of degree
    > 1 when there are two or more, each number right-aligned under its axis's name."""

    def __init__(self, info: RunInfo) -> None:
        try:
            mesh: Mesh | None = info.mesh
        except ValueError:  # a damaged recording's layout: the ranks alone (the mesh pane says what is wrong)
            mesh = None
        axes = shown_axes(mesh) if mesh is not None else ()
        self.mesh = mesh if len(axes) > 1 else None
        # axis -> its name in the heading: two letters are too many for 80 columns from three axes on
        self.names = {a: a if len(axes) < 3 else a[0] for a in axes}
        self.widths = {a: max(len(self.names[a]), len(str(mesh.degree(a) - 1))) for a in axes} \
            if mesh is not None else {}
        names = [self.names[a].rjust(w) for a, w in self.widths.items()]
        self.heading = " ".join(["rank", *names]) if self.mesh is not None else "rank"

    def cell(self, rank: int) -> str:
        if self.mesh is None or rank >= self.mesh.world_size:  # (a rank beyond the world: see redraw)
            return str(rank)
        coords = rank_coords(self.mesh, rank)
        return " ".join([f"{rank:>4}", *(f"{coords[a]:>{w}}" for a, w in self.widths.items())])


class RankTable(DataTable):
    def __init__(self, info: RunInfo, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self.border_title = "ranks"
        self.info = info
        self.stats: dict[int, RankStats] = {}
        self.comm_s: dict[int, float] = {}
        self.memory_peak: dict[int, int] = {}
        self._shown: dict[int, tuple] = {}
        self.where = RankPlaces(info)

    def on_mount(self) -> None:
        figure = {"step": len(str(self.info.total_steps))}  # the rank's cells are as wide as its heading
        for key, label, width in COLUMNS:
            label = self.where.heading if key == "rank" else label
            self.add_column(_right(label), key=key, width=max(len(label), width, figure.get(key, 0)))
        for rank in range(self.info.world_size):
            cells = (_right(self.where.cell(rank)) if key == "rank" else _right("-") for key, _, _ in COLUMNS)
            self.add_row(*cells, key=str(rank))

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
                "rank": self.where.cell(rank),
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
                self.update_cell(str(rank), column, _right(value))
            self._shown[rank] = figures
