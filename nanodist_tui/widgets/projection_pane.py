"""The projection pane: pick a cluster, see the run's scaling curve and step breakdown per world size, and
beside a live run its predicted step time against the measured one.

The projection (engine.projection, a few hundred milliseconds: memory estimates per world size) runs on a
worker thread and comes back as a `ProjectionReady` message (post_message: never blocks the worker, so an
app that is closing cannot deadlock with it); the pane only stores ticks in `ingest` (the run's
config from RunStarted, recent step times) and draws in `redraw`, when it is on screen. A calibrated
cluster (this machine) needs a calibration of the run's model: without one the pane says so, and `c`
(in the projection screen) measures it.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import DataTable, Select, Static
from textual_plotext import PlotextPlot

from engine.events import RunStarted
from nanodist_tui.messages import Tick
from nanodist_tui.widgets.table_columns import add_fitted_columns

RECENT_STEPS = 30  # the measured step time is the median of this many recent steps
MAX_Y_TICKS = 4  # powers of ten labelled on the scaling plot's axis (fits its 80x24 height)
X_TICK_COLUMNS = 7  # columns a rank-count label needs on the x axis ("1024" and room on both sides)
COLUMNS = ("ranks", "step ms", "compute", "overlap", "exposed", "comm", "tokens/s", "scaling", "MFU",
           "MB/rank", "fits")
# The same columns headed shorter, for a table narrower than the long headers need (80 columns, or half of
# 160): the times' unit (ms) goes into the table's title. Every column stays; no figure is cut.
SHORT_COLUMNS = ("ranks", "step", "comp", "ovl", "exp", "comm", "tok/s", "scal", "MFU", "MB/r", "fits")
CELL_PADDING = 2  # a DataTable cell's padding, both sides together


def _ms(seconds: float) -> str:
    """Milliseconds to 3 significant digits, never in e-notation: 1.23, 12.3, 123, 1234."""
    v = seconds * 1e3
    return f"{v:.2f}" if round(v, 2) < 10 else f"{v:.1f}" if round(v, 1) < 100 else f"{v:.0f}"


def _count(n: float) -> str:
    """A rate to 3 significant digits with k/M/G (980, 1.23k, 45.6k, 789M), never e-notation."""
    for suffix, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            v = n / size
            if round(v, 1) >= 100:
                return f"{v:.0f}{suffix}"
            return f"{v:.2f}{suffix}" if round(v, 2) < 10 else f"{v:.1f}{suffix}"
    return f"{n:.0f}"


def table_rows(rows: list[dict]) -> list[tuple[str, ...]]:
    """The projection's rows as the table's cells, one tuple per world size, in COLUMNS' order."""
    cells = []
    for r in rows:
        fits = "-" if r["fits"] is None else ("yes" if r["fits"] else "NO")
        ms = [_ms(r[k]) for k in ("step_s", "compute_s", "overlapped_s", "exposed_s")]
        cells.append((str(r["world_size"]), *ms, f"{r['comm_share']:.0%}", _count(r["tokens_per_s"]),
                      f"{r['scaling_efficiency']:.0%}", f"{r['mfu']:.1%}", f"{r['peak_bytes'] / 1e6:.1f}",
                      fits))
    return cells


def headers_for(cells: list[tuple[str, ...]], width: int) -> tuple[str, ...]:
    """The long headers where they fit in `width` cells, else the short ones."""
    def need(headers: tuple[str, ...]) -> int:
        return sum(max([len(h), *(len(c[i]) for c in cells)]) + CELL_PADDING for i, h in enumerate(headers))
    return COLUMNS if need(COLUMNS) <= width else SHORT_COLUMNS


def draw_scaling(plt, rows: list[dict], max_ticks: int = MAX_Y_TICKS, max_x_ticks: int | None = None) -> None:
    """Tokens/s against ranks on log axes, with ideal linear scaling from the first row, on any plotext-like
    object (the plotext module for the CLI, a PlotextPlot's `plt` here). The logarithms are taken here and
    the axes labelled in the original units: plotext's own log scales re-apply the log to explicit ticks
    when a widget builds the same figure twice."""
    xs = [math.log2(r["world_size"]) for r in rows]
    ys = [math.log10(r["tokens_per_s"]) for r in rows]
    ideal = [ys[0] + math.log10(r["world_size"] / rows[0]["world_size"]) for r in rows]
    plt.plot(xs, ideal, label="linear scaling", marker="dot")
    plt.plot(xs, ys, label="projected", marker="braille")
    # Likewise along x: where two rank counts' labels would meet, plotext drops either one.
    step = max(1, math.ceil(len(xs) / max(2, max_x_ticks))) if max_x_ticks else 1
    plt.xticks(xs[::step], [str(r["world_size"]) for r in rows][::step])
    low, high = math.floor(min(ys + ideal)), math.ceil(max(ys + ideal))
    # At most `max_ticks` labels: given two for one row, plotext keeps either (set order, which changes with
    # each process's hash seed), so a small screen showed 1e9 one time and 1e7 the next for the same data.
    every = max(1, math.ceil((high - low + 1) / max(2, max_ticks)))
    powers = list(range(low, high + 1, every))
    plt.yticks(powers, [f"1e{k}" for k in powers])
    plt.title("tokens/s by ranks (log-log)")
    plt.xlabel("ranks")


class ProjectionReady(Message):
    """A projection computed on a worker thread: {"rows", "live_step_s", ...} or {"error": one line}."""

    def __init__(self, result: dict) -> None:
        super().__init__()
        self.result = result


class ProjectionPane(Vertical):
    """Implements the Pane protocol (widgets/pane.py)."""

    def __init__(self, preset_name: str, calibration_path: Path | None = None, *, id: str | None = None):
        super().__init__(id=id)
        self.preset_name, self.calibration_path = preset_name, calibration_path
        self.config: dict | None = None  # the live run's, from its RunStarted
        self.world_size = 1
        self.steps: deque[float] = deque(maxlen=RECENT_STEPS)
        self.result: dict | None = None  # the latest projection (worker thread)
        self.cluster = "this-machine"
        self.cluster_names: list[str] = []  # the cluster files found, in the list's order (compose)
        self._stale = True  # the projection must be recomputed
        self._dirty = True  # the live comparison must be redrawn

    def compose(self) -> ComposeResult:
        from engine.projection.clusters import list_clusters
        names = self.cluster_names = [p.stem for p in list_clusters()]
        yield Select([(n, n) for n in names], value=self.cluster if self.cluster in names else names[0],
                     allow_blank=False, id="projection-cluster")
        yield Static("", id="projection-live")
        with Horizontal(id="projection-body"):
            yield PlotextPlot(id="projection-plot")
            yield DataTable(id="projection-table", zebra_stripes=True)
            yield Static("", id="projection-empty")

    def on_mount(self) -> None:
        self.query_one("#projection-table", DataTable).add_columns(*COLUMNS)
        self._show_empty(None)

    def on_resize(self) -> None:
        if self.result is not None:  # the headers' form depends on the table's width
            self.call_after_refresh(self._show, self.result)

    # ------------------------------------------------------------------ the Pane protocol

    def ingest(self, tick: Tick) -> None:
        for event in tick.events:
            if isinstance(event, RunStarted):
                self.config, self.world_size = event.config, event.world_size
                self.steps.clear()
                self._stale = True
        fresh = [s.step_time_s for s in tick.steps if not s.skipped]
        if fresh:
            self.steps.extend(fresh)
            self._dirty = True

    def redraw(self) -> None:
        if not (self.is_mounted and self.is_on_screen):
            return
        if self._stale:
            self._stale = False
            self.refresh_projection()
        if self._dirty:
            self._dirty = False
            self.query_one("#projection-live", Static).update(self.live_text())

    # ------------------------------------------------------------------ computing (worker thread)

    def on_select_changed(self, event: Select.Changed) -> None:
        if event.value != self.cluster and isinstance(event.value, str):
            self.cluster = event.value
            self.refresh_projection()

    def refresh_projection(self) -> None:
        self._say(Text(f"projecting onto {self.cluster} ...", style="dim"))
        self.run_worker(self._compute, thread=True, exclusive=True, group="projection")

    def _compute(self) -> None:
        cluster = self.cluster
        result = compute_projection(self._cfg(), cluster, self.calibration_path)
        # A thread worker cannot be stopped: one for a cluster the user has since left still finishes, and
        # its result must not replace the one for the cluster now chosen.
        self.post_message(ProjectionReady({**result, "requested": cluster}))

    def calibrate(self) -> None:
        """Measure this machine for the run's model on a worker thread, then project again."""
        self._say(Text("calibrating this machine (about a minute) ...", style="bold yellow"))
        self.run_worker(self._calibrate, thread=True, exclusive=True, group="projection")

    def _calibrate(self) -> None:
        from engine.config.build import vocab_size
        from engine.projection.calibrate import calibrate, default_path
        cfg = self._cfg()
        try:
            calibrate(cfg, vocab_size(cfg) if cfg.model.kind == "gpt" else 0, [cfg.precision.dtype],
                      path=self.calibration_path or default_path())
        except Exception as e:  # noqa: BLE001 - shown in the pane, never crashes the app
            self.post_message(ProjectionReady({"error": f"calibration failed: {e}"}))
            return
        self._compute()

    def _say(self, text: Text) -> None:
        self.query_one("#projection-live", Static).update(text)

    def _cfg(self):
        from engine.config import from_dict
        from engine.config.presets import load_preset
        if self.config is not None:
            return from_dict(self.config, source="<live run>")
        return load_preset(self.preset_name)[0]

    # ------------------------------------------------------------------ drawing

    def on_projection_ready(self, message: ProjectionReady) -> None:
        if message.result.get("requested", self.cluster) == self.cluster:
            self._show(message.result)

    def _show(self, result: dict) -> None:
        self.result = result
        self._dirty = True
        plot_was_shown = self.query_one("#projection-plot").display
        self._show_empty(None if result.get("rows") else result.get("error", "no projection"))
        if result.get("rows") and not plot_was_shown:
            # the plot and the table are drawn for their sizes, which they have once laid out again
            self.call_after_refresh(self._show, result)
            return
        table = self.query_one("#projection-table", DataTable)
        cells = table_rows(result.get("rows") or [])
        headers = headers_for(cells, table.scrollable_content_region.width or table.size.width)
        table.clear(columns=True)
        add_fitted_columns(table, headers, cells)
        table.border_title = "times in ms" if headers is SHORT_COLUMNS else None
        plot = self.query_one("#projection-plot", PlotextPlot)
        plot.plt.clear_data()
        plot.plt.clear_figure()
        rows = result.get("rows") or []
        for row in cells:
            table.add_row(*(Text(c, justify="right") for c in row))
        if len(rows) > 1:
            # a label every third row at most: the plot's frame, title and x axis take about five rows
            draw_scaling(plot.plt, rows, min(MAX_Y_TICKS, (plot.size.height - 5) // 3),
                         (plot.size.width - 8) // X_TICK_COLUMNS)
            # the title on the border, and at small sizes no axis label: the rows go to the curve
            plot.border_title = "tokens/s by ranks (log-log)"
            plot.plt.title("")
            if self.app.has_class("compact"):
                plot.plt.xlabel("")
        plot.refresh()
        self._say(self.live_text())

    def _show_empty(self, why: str | None) -> None:
        """Without a projection, one box that says why and what to do takes the place of an empty plot and
        an empty table; with one, the plot and the table."""
        empty = self.query_one("#projection-empty", Static)
        empty.display = why is not None
        self.query_one("#projection-plot").display = why is None
        self.query_one("#projection-table").display = why is None
        if why is not None:
            others = ", ".join(name for name in self.cluster_names if name != self.cluster)
            empty.update(Text.assemble(("Nothing to project yet. ", "bold"), why, "\n\n",
                                       f"Or choose another cluster in the list above ({others})."))

    def live_text(self) -> Text:
        r = self.result or {}
        if "error" in r:
            return Text(r["error"], style="bold red")
        text = Text()
        predicted = r.get("live_step_s")
        if predicted is not None:
            text.append(f"{r.get('cluster', self.cluster)}: {self.world_size} rank(s) predicted "
                        f"{predicted * 1e3:.1f} ms/step")
        if self.steps:
            measured = statistics.median(self.steps)
            text.append(f"   measured here {measured * 1e3:.1f} ms/step (median of the last "
                        f"{len(self.steps)})")
            if predicted is not None and r.get("calibrated"):
                text.append(f"   error {(predicted - measured) / measured:+.0%}", style="bold")
        if not text:
            text.append("no run yet: the projection is of the preset", style="dim")
        return text


def compute_projection(cfg, cluster_name: str, calibration_path: Path | None) -> dict:
    """The projection the pane shows (JSON-like), or {"error": one line}; never raises."""
    from engine.config import ConfigError
    from engine.projection.calibrate import Calibration, CalibrationError, default_path
    from engine.projection.clusters import load_cluster
    from engine.projection.flops import model_signature
    from engine.projection.project import predict, project
    try:
        cluster = load_cluster(cluster_name)
        calibration = None
        if cluster.calibrated:
            from engine.config.build import vocab_size
            calibration = Calibration.load(calibration_path or default_path())
            vocab = vocab_size(cfg) if cfg.model.kind == "gpt" else 0
            if calibration is None or calibration.missing(model_signature(cfg, vocab), [cfg.precision.dtype]):
                return {"error": f"{cluster.name}: no calibration of this model in {cfg.precision.dtype} "
                                 "yet; press c to measure it (about a minute)"}
        report = project(cfg, cluster, calibration=calibration)
        live = predict(cfg, cluster, calibration)[0] if cfg.parallel.world_size <= cluster.max_ranks else None
        return {"cluster": cluster.name, "calibrated": cluster.calibrated,
                "rows": [row.as_dict() for row in report["rows"]],
                "live_step_s": live.step_s if live is not None else None}
    except (ConfigError, CalibrationError, ValueError) as e:
        return {"error": str(e).splitlines()[0]}
