"""Two recorded runs side by side (ZeRO-1 against ZeRO-3, fp32 against fp16, ...): loss curves overlaid, with
optional smoothing (m), their memory by category and their traffic per phase in adjacent columns."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Static
from textual_plotext import PlotextPlot

from engine.run.printable import printable
from nanodist_tui.compare import RunFigures, read_run, smooth
from nanodist_tui.traffic import phase_rank
from nanodist_tui.widgets.axes import GrowingRange, step_ticks, value_ticks
from nanodist_tui.widgets.footer import WorkbenchFooter
from nanodist_tui.widgets.glyphs import glyphs_of
from nanodist_tui.widgets.memory_pane import ordered, style_of
from nanodist_tui.widgets.units import format_bytes, format_count, format_rate

SMOOTHING = (0.0, 0.6, 0.9, 0.97)
COLORS = (("cyan", "blue"), ("orange", "red"))  # (train, val) per run


def _shape(r: RunFigures) -> str:
    i = r.info
    return printable(f"{i.world_size} rank(s) on {i.backend} · ZeRO-{i.zero_stage} · {i.dtype} · "
                     f"checkpointing {i.checkpointing}")


class ComparePlot(PlotextPlot):
    def __init__(self, runs: tuple[RunFigures, RunFigures], *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.runs = runs
        self.weight = 0.0
        self.border_title = "loss: A and B"

    def on_mount(self) -> None:
        self.draw()

    def draw(self) -> None:
        plt = self.plt
        plt.clear_data()
        plt.xlabel("step")
        marker = glyphs_of(self).plot_marker
        y = GrowingRange()
        last = 1
        for label, run, (train_color, val_color) in zip("AB", self.runs, COLORS):
            for kind, points, color in (("train", smooth(run.train, self.weight), train_color),
                                        ("val", run.val, val_color)):
                if points:
                    xs, ys = zip(*points)
                    plt.plot(list(xs), list(ys), label=f"{label} {kind}", marker=marker, color=color)
                    y.include(ys)
                    last = max(last, xs[-1])
        ticks = step_ticks(0, last, self.size.width or 80)
        plt.xlim(0, last)
        plt.xticks(cast(list[float], ticks), [str(t) for t in ticks])  # the stub's list[float]: see live_plot
        lo, hi = y.limits()
        plt.ylim(lo, hi)
        plt.yticks(*value_ticks(lo, hi, self.size.height or 20))
        title = "loss: A and B" + (f" · train smoothed (EMA {self.weight:g})" if self.weight else "")
        self.border_title = title
        self.refresh()

    def on_resize(self) -> None:
        self.draw()


def _memory_row(label: str, x: int, y: int) -> str:
    return f"{label:<22}{format_bytes(x, 11)}{format_bytes(y, 11)}{format_bytes(y - x, 11)}\n"


def memory_table(a: RunFigures, b: RunFigures) -> Text:
    out = Text()
    out.append(f"{'per rank (its peak)':<22}{'A':>11}{'B':>11}{'B - A':>11}\n", style="bold")
    cats = dict.fromkeys([k for k, _ in ordered(a.memory)] + [k for k, _ in ordered(b.memory)])
    for category in cats:
        out.append(_memory_row(style_of(category)[0], a.memory.get(category, 0), b.memory.get(category, 0)))
    x, y = a.memory_total, b.memory_total
    out.append(_memory_row("peak total", x, y), style="bold")
    if x:
        out.append(f"B holds {y / x:.0%} of A's peak\n", style="dim")
    return out


def traffic_table(a: RunFigures, b: RunFigures) -> Text:
    out = Text()
    head = f"{'rank 0, per step':<16}{'A sent':>10}{'A busbw':>12}{'B sent':>10}{'B busbw':>12}\n"
    out.append(head, style="bold")
    phases = sorted(set(a.phase_bytes) | set(b.phase_bytes), key=phase_rank)
    for phase in phases:
        cells = []
        for run in (a, b):
            sent = run.phase_bytes.get(phase)
            bw = run.phase_busbw.get(phase)
            cells.append(format_bytes(sent, 10) if sent is not None else f"{'-':>10}")
            cells.append(format_rate(bw, 12) if bw is not None else f"{'-':>12}")
        out.append(f"{printable(phase):<16}{''.join(cells)}\n")
    if not phases:
        out.append("no traffic: single-rank runs\n", style="dim")
    out.append("\n")
    rows = [("tokens/s", lambda r: "-" if r.tokens_per_s is None else format_count(r.tokens_per_s)),
            ("final val loss", lambda r: "-" if r.final_val is None else f"{r.final_val:.4f}"),
            ("steps", lambda r: str(r.steps))]
    if a.bubble is not None or b.bubble is not None:  # rank 0's pipeline, median over steps
        rows.append(("pipeline bubble", lambda r: "-" if r.bubble is None else f"{r.bubble:.1%}"))
    for label, getter in rows:
        out.append(f"{label:<16}{getter(a):>22}{getter(b):>22}\n")
    return out


def _figures(run: Path | RunFigures) -> RunFigures:
    return run if isinstance(run, RunFigures) else read_run(run)


class CompareScreen(Screen[None]):
    BINDINGS = [Binding("m", "smoothing", "Smoothing", id="compare-smoothing"),
                Binding("escape", "close", "Back", id="compare-close")]

    def __init__(self, run_a: Path | RunFigures, run_b: Path | RunFigures) -> None:
        super().__init__()
        self.runs = (_figures(run_a), _figures(run_b))

    def compose(self) -> ComposeResult:
        a, b = self.runs
        title = Text()
        for label, run in (("A", a), ("B", b)):
            title.append(f"{label} ", style="bold reverse")
            title.append(f" {printable(run.name)}  ", style="bold")
            title.append(_shape(run) + "\n", style="dim")
        yield Static(title, id="compare-title")
        yield ComparePlot(self.runs, id="compare-plot")
        with Horizontal(id="compare-tables"):
            yield Static(memory_table(a, b), id="compare-memory")
            yield Static(traffic_table(a, b), id="compare-traffic")
        yield WorkbenchFooter()

    def on_mount(self) -> None:
        self.query_one("#compare-memory").border_title = "memory"
        self.query_one("#compare-traffic").border_title = "traffic and throughput"

    def action_close(self) -> None:
        """Back to what opened it (dismissed, so the opener's callback runs: `nanodist-tui compare`, with no
        run behind the screen, leaves the workbench instead of showing an empty one)."""
        self.dismiss(None)

    def action_smoothing(self) -> None:
        plot = self.query_one(ComparePlot)
        plot.weight = SMOOTHING[(SMOOTHING.index(plot.weight) + 1) % len(SMOOTHING)]
        plot.draw()
