"""The sweep pane: a table of trials updated in place, the best so far, the optimization history, the
running trials' intermediate values and, for two metrics, the Pareto front.

The table keeps one row per trial, keyed by its number: a trial's row is added when it starts (or, for
trials of an earlier run of a resumed sweep, when the sweep reports them) and its cells change in place
when it finishes, so the cursor and the scroll position stay where the user put them.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Static

from engine.events import SweepFinished, SweepStarted, TrialFinished, TrialStarted
from engine.run.printable import printable
from nanodist_tui.describe import best_text, number, params_text
from nanodist_tui.messages import Tick
from nanodist_tui.widgets.sweep_plots import HistoryPlot, IntermediatePlot, ParetoPlot

STATE_STYLES = {"running": "bold cyan", "complete": "green", "pruned": "yellow", "failed": "red",
                "rejected": "magenta"}
BEST_MARK = " *"


class TrialTable(DataTable):
    """One row per trial: number, state, the metrics, steps, duration, parameters (or the reason). DataTable
    reads a str cell or label as markup: names and reasons (anyone's text) go in as escaped Text."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self.metrics: list[str] = []
        self.rows_pending: dict[int, dict[str, object]] = {}  # trial number -> cells changed since drawn
        self.best: list[int] = []
        self._columns_made = False

    def set_metrics(self, metrics: list[str]) -> None:
        self.metrics = list(metrics)

    def note(self, trial: int, **cells: object) -> None:
        self.rows_pending.setdefault(trial, {}).update(cells)

    def flush(self) -> None:
        if not self._columns_made:
            for key in ("trial", "state", *self.metrics, "steps", "time", "parameters"):
                self.add_column(Text(printable(key)), key=key)
            self._columns_made = True
        for trial, cells in sorted(self.rows_pending.items()):
            key = str(trial)
            if key not in self.rows:
                self.add_row(str(trial), *["-"] * (len(self.columns) - 1), key=key)
            for column, value in cells.items():
                self.update_cell(key, column, value)  # in place: clear() would reset the cursor
        self.rows_pending.clear()


class SweepPane(Vertical):
    """Implements the Pane protocol: `ingest` stores a tick's trial events, `redraw` draws them."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = "sweep"
        self.summary = Static("waiting for the sweep to start", id="sweep-summary")
        self.table = TrialTable(id="sweep-trials")
        self.history = HistoryPlot(id="sweep-history")
        self.intermediate = IntermediatePlot(id="sweep-intermediate")
        self.pareto = ParetoPlot(id="sweep-pareto")
        self.started: SweepStarted | None = None
        self.counts: dict[str, int] = {}
        self.last: TrialFinished | None = None
        self.running: set[int] = set()
        self.finished: SweepFinished | None = None
        self._dirty = False

    def compose(self) -> ComposeResult:
        yield self.summary
        with Horizontal(id="sweep-body"):
            yield self.table
            yield self.history
            yield self.intermediate
            yield self.pareto

    def on_mount(self) -> None:
        self.pareto.display = False  # shown for a study of two metrics

    def ingest(self, tick: Tick) -> None:
        for plot in (self.history, self.intermediate, self.pareto):
            plot.ingest(tick)
        for e in tick.events:
            if isinstance(e, SweepStarted):
                self.started = e
                self.table.set_metrics(e.metrics)
            elif isinstance(e, TrialStarted):
                self.running.add(e.number)
                self.table.note(e.number, state=Text("running", style=STATE_STYLES["running"]),
                                parameters=Text(printable(params_text(e.params))))
            elif isinstance(e, TrialFinished):
                self._finished(e)
            elif isinstance(e, SweepFinished):
                self.finished = e
            else:
                continue
            self._dirty = True

    def _finished(self, e: TrialFinished) -> None:
        self.running.discard(e.number)
        self.counts[e.state] = self.counts.get(e.state, 0) + 1
        self.last = e
        values = e.values if e.state in ("complete", "pruned") and e.values else [None] * len(e.metrics)
        detail = params_text(e.params) + (f"  ({e.reason})" if e.reason else "")
        self.table.note(e.number, state=self._state_cell(e.state, e.number in (e.best or [])),
                        **{m: "-" if v is None else number(v) for m, v in zip(e.metrics, values)},
                        steps=str(e.steps), time=f"{e.duration_s:.1f}s", parameters=Text(printable(detail)))
        for trial in set(self.table.best) ^ set(e.best or []):  # the best marks that change
            if trial != e.number:
                self.table.note(trial, state=self._state_cell("complete", trial in (e.best or [])))
        self.table.best = list(e.best or [])

    @staticmethod
    def _state_cell(state: str, best: bool) -> Text:
        return Text(printable(state) + (BEST_MARK if best else ""), style=STATE_STYLES.get(state, ""))

    def redraw(self) -> None:
        if self.started is not None and len(self.started.metrics) >= 2 and not self.pareto.display:
            self.pareto.display = True
        for plot in (self.history, self.intermediate, self.pareto):
            plot.redraw()
        if not self._dirty:
            return
        self._dirty = False
        if self.table.is_mounted:
            self.table.flush()
        self.summary.update(self.summary_text())

    def summary_text(self) -> Text:
        s = self.started
        text = Text()
        if s is None:
            return Text("waiting for the sweep to start", style="dim")
        goal = ", ".join(f"{d} {m}" for m, d in zip(s.metrics, s.directions))
        done = sum(self.counts.values())  # this run's trials and, resumed, the earlier ones
        total = f"/{s.n_trials}" if s.n_trials else ""
        text.append(printable(f"study {s.study}"), style="bold")
        text.append(printable(f"  {goal}  {done}{total} trials  "))
        counts = ", ".join(f"{n} {state}" for state, n in sorted(self.counts.items()))
        text.append(printable(counts), style="dim")
        if self.last is not None:
            last = self.last
            text.append(printable("  " + best_text(last.best, last.metrics, last.best_values)), style="green")
        if self.running:
            text.append(f"  running: trial {', '.join(map(str, sorted(self.running)))}", style="cyan")
        if self.finished is not None:
            text.append("  stopped" if self.finished.stopped else "  finished", style="bold")
            if self.finished.best:  # what the command line does next, spelled out here
                after = (f"best as a preset: nanodist-tui sweep export-best {s.sweep_dir} -o best.toml  ·  "
                         f"all trials: {s.sweep_dir}/trials.csv  ·  optuna-dashboard {s.storage}")
                text.append("\n" + printable(after), style="dim")
        return text
