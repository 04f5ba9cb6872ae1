"""The curves pane: loss (train and validation) over the full width, gradient norm and learning rate side by
side below it, all on one step axis; the three share the pane's height, so every plot stays inside the screen
at 80x24 (stacked, they ran off it)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical

from nanodist_tui.messages import Tick
from nanodist_tui.run_info import RunInfo
from nanodist_tui.widgets.loss_plot import LossPlot
from nanodist_tui.widgets.metric_plot import MetricPlot


class CurvesPane(Vertical):
    def __init__(self, info: RunInfo, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.plots = (LossPlot(info, id=f"{id}-loss" if id else None),
                      MetricPlot(info, "grad_norm", "gradient norm", "magenta"),
                      MetricPlot(info, "lr", "learning rate", "green"))

    def compose(self) -> ComposeResult:
        loss, *metrics = self.plots
        yield loss
        with Horizontal(classes="curves-metrics"):
            yield from metrics

    def ingest(self, tick: Tick) -> None:
        for plot in self.plots:
            plot.ingest(tick)

    def redraw(self) -> None:
        for plot in self.plots:
            plot.redraw()
