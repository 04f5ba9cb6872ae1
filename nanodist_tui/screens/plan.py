"""The plan screen (the palette's "Plan a layout"): the run's preset laid out on a cluster by the planner
(engine.projection.planner, what `nanodist-tui plan` prints). Pick a cluster and a world size, enter
searches; the table ranks the layouts that fit, the line under it gives the highlighted one's memory per
rank and why the next ones lose; `s` starts the highlighted layout here, scaled down to this machine (the
model and ranks `plan --validate` uses); escape closes.

The search runs on a worker thread and comes back as a `PlanReady` message: a large model takes seconds.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Input, Label, Select, Static

from nanodist_tui.widgets.footer import WorkbenchFooter
from nanodist_tui.widgets.table_columns import add_fitted_columns

# 80 columns hold these: the split's exposed communication is one column here, by group in the line below
COLUMNS = ("#", "layout", "step", "tok/s", "MFU", "comp", "bubble", "comm", "GB")
DEFAULT_RANKS = 8
GB = 1e9


class PlanReady(Message):
    """A search's result (planner.plan with its candidates as dicts), or {"error": one line}."""

    def __init__(self, result: dict) -> None:
        super().__init__()
        self.result = result


def _ms(seconds: float) -> str:
    v = seconds * 1e3
    return f"{v:.3g}" if v < 1000 else f"{v:.0f}"


def _count(n: float) -> str:
    for suffix, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{suffix}"
    return f"{n:.3g}"


def table_rows(ranked: list[dict]) -> list[tuple[str, ...]]:
    """The ranked layouts as the table's cells, in COLUMNS' order."""
    rows: list[tuple[str, ...]] = []
    for n, c in enumerate(ranked, 1):
        s = c["split"]
        comm = sum(v for k, v in s.items() if k not in ("compute", "bubble"))
        rows.append((str(n), c["label"], _ms(c["step_s"]), _count(c["tokens_per_s"]), f"{c['mfu']:.1%}",
                     _ms(s["compute"]), _ms(s["bubble"]), _ms(comm), f"{c['peak_bytes'] / GB:.3g}"))
    return rows


def detail_text(result: dict, row: int) -> Text:
    """The highlighted layout's memory per rank by category, and the first reasons of the rest."""
    ranked = result.get("ranked") or []
    text = Text()
    if 0 <= row < len(ranked):
        c = ranked[row]
        split = ", ".join(f"{k} {_ms(v)}" for k, v in c["split"].items() if v or k == "compute")
        memory = ", ".join(f"{k} {v / GB:.3g}" for k, v in c["memory"].items() if v)
        text.append(f"#{row + 1} step split, ms: {split}\n", style="bold")
        text.append(f"memory per rank, GB: {memory}\n")
    for c in (result.get("rest") or [])[:3]:
        text.append(f"{c['verdict']}: {c['label']}: {c['why']}\n", style="dim")
    counts = result.get("counts", {})
    text.append(", ".join(f"{n} {k}" for k, n in counts.items()), style="dim")
    return text


def search(cfg, cluster_name: str, ranks: int) -> dict:
    """The planner's report as JSON-like dicts, or {"error": one line}; never raises."""
    from engine.config import ConfigError
    from engine.projection.calibrate import Calibration, CalibrationError, default_path
    from engine.projection.clusters import load_cluster
    from engine.projection.planner import plan
    try:
        cluster = load_cluster(cluster_name)
        if ranks > cluster.max_ranks:
            return {"error": f"{cluster.name} has {cluster.max_ranks} ranks; ask for at most that many"}
        calibration = Calibration.load(default_path()) if cluster.calibrated else None
        report = plan(cfg, cluster, ranks, calibration=calibration)
        return {**report, "ranked": [c.as_dict() for c in report["ranked"]],
                "rest": [c.as_dict() for c in report["rest"]]}
    except (ConfigError, CalibrationError, ValueError, KeyError) as e:
        return {"error": str(e).splitlines()[0] if str(e) else type(e).__name__}


class PlanScreen(Screen[Any]):
    """Dismissed with (Config, TOMLDocument) to start the chosen layout here, or None."""

    BINDINGS = [Binding("escape", "close", "Close", id="plan-close"),
                Binding("s", "start", "Start it here (scaled down)", id="plan-start")]
    DEFAULT_CSS = """
    #plan-title { padding: 0 1; background: $boost; }
    #plan-controls { height: 3; }
    #plan-controls Label { padding: 1 1 0 1; }
    #plan-cluster { width: 36; }
    #plan-ranks { width: 12; }
    #plan-status { height: auto; padding: 0 1; }
    #plan-table { height: 1fr; border: round $primary-darken-1; }
    #plan-detail { height: auto; max-height: 7; padding: 0 1; }
    """

    def __init__(self, cfg, cluster: str = "h100-ndr", ranks: int = DEFAULT_RANKS) -> None:
        super().__init__()
        self.cfg, self.cluster, self.ranks = cfg, cluster, ranks
        self.result: dict | None = None
        self.cluster_names: list[str] = []

    def compose(self) -> ComposeResult:
        from engine.projection.clusters import list_clusters
        self.cluster_names = [p.stem for p in list_clusters()]
        if self.cluster not in self.cluster_names and self.cluster_names:
            self.cluster = self.cluster_names[0]
        yield Static(f"plan: the layouts of {self.cfg.name} on a cluster; enter searches, s starts the "
                     "highlighted one here", id="plan-title")
        with Horizontal(id="plan-controls"):
            yield Select([(n, n) for n in self.cluster_names], value=self.cluster, allow_blank=False,
                         id="plan-cluster")
            yield Label("ranks")
            yield Input(str(self.ranks), id="plan-ranks", type="integer")
        yield Static("", id="plan-status")
        yield DataTable(id="plan-table", zebra_stripes=True, cursor_type="row")
        yield Static("", id="plan-detail")
        yield WorkbenchFooter()

    def on_mount(self) -> None:
        self.query_one("#plan-table", DataTable).add_columns(*COLUMNS)
        self.refresh_plan()

    def _say(self, text: str, style: str = "") -> None:
        self.query_one("#plan-status", Static).update(Text(text, style=style))

    # ---- searching ------------------------------------------------------------------------------------

    def on_select_changed(self, event: Select.Changed) -> None:
        if isinstance(event.value, str) and event.value != self.cluster:
            self.cluster = event.value
            self.refresh_plan()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        try:
            ranks = int(event.value)
        except ValueError:
            ranks = 0
        if ranks < 1:
            self._say(f"ranks: {event.value!r} is not a whole number >= 1", "bold red")
            return
        self.ranks = ranks
        self.refresh_plan()

    def refresh_plan(self) -> None:
        self._say(f"searching the layouts of {self.ranks} ranks on {self.cluster} ...", "dim")
        self.run_worker(self._compute, thread=True, exclusive=True, group="plan")

    def _compute(self) -> None:
        cluster, ranks = self.cluster, self.ranks
        result = search(self.cfg, cluster, ranks)
        self.post_message(PlanReady({**result, "requested": (cluster, ranks)}))

    def on_plan_ready(self, message: PlanReady) -> None:
        if message.result.get("requested") != (self.cluster, self.ranks):
            return  # a search the user has since left
        self.result = result = message.result
        table = self.query_one("#plan-table", DataTable)
        table.clear()
        if "error" in result:
            self._say(result["error"], "bold red")
            self.query_one("#plan-detail", Static).update("")
            return
        cells = table_rows(result["ranked"])
        table.clear(columns=True)
        add_fitted_columns(table, COLUMNS, cells)
        for row in cells:
            table.add_row(*(Text(c, justify="left" if i == 1 else "right") for i, c in enumerate(row)))
        fits = "no layout fits" if not result["ranked"] else f"the best {len(result['ranked'])} that fit"
        self._say(f"{result['preset']} on {result['cluster']}, {result['ranks']} ranks, global batch "
                  f"{result['global_batch']}: {fits} of {result['counts']['layouts']} layouts "
                  "(ms; comm: exposed, all groups)")
        self.query_one("#plan-detail", Static).update(detail_text(result, 0))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if self.result is not None and "error" not in self.result:
            self.query_one("#plan-detail", Static).update(detail_text(self.result, event.cursor_row))

    # ---- leaving ---------------------------------------------------------------------------------------

    def action_close(self) -> None:
        self.dismiss(None)

    def action_start(self) -> None:
        """The highlighted layout, scaled down to this machine (plan --validate's model and ranks)."""
        ranked = (self.result or {}).get("ranked") or []
        if not ranked:
            self._say("nothing to start: search first (enter), or pick a layout that fits", "yellow")
            return
        import tomlkit

        from engine.comm.cores import usable_cores
        from engine.config import ConfigError, from_dict, to_dict
        from engine.projection.planner_space import Layout, apply
        from engine.projection.planner_validate import scaled_down
        row = self.query_one("#plan-table", DataTable).cursor_row
        layout = Layout(**ranked[max(0, row)]["layout"])
        base, _ = scaled_down(self.cfg)
        here = max(2, min(self.ranks, len(usable_cores())))
        cell = layout.tensor * layout.pipeline * layout.context
        scale = here // cell
        try:
            if scale < 1:
                raise ConfigError("parallel", f"{layout.label()} needs {cell} ranks and this machine runs "
                                  f"{here}", "pick a layout with fewer model-parallel ranks", source="plan")
            small = Layout(**{**layout.as_dict(), "data": scale, "expert": 1})
            cfg = from_dict(to_dict(apply(base, small, here)), source="plan")
        except ConfigError as e:
            self._say(str(e), "bold red")
            return
        self.dismiss((cfg, tomlkit.parse(tomlkit.dumps(to_dict(cfg)))))
