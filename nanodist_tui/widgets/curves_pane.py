"""The curves pane: loss (train and validation), gradient norm and learning rate, stacked on one step axis
(scrolling when the terminal is too short for all three)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import VerticalScroll

from nanodist_tui.messages import Tick
from nanodist_tui.run_info import RunInfo
from nanodist_tui.widgets.loss_plot import LossPlot
from nanodist_tui.widgets.metric_plot import MetricPlot


class CurvesPane(VerticalScroll):
    def __init__(self, info: RunInfo, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.plots = (LossPlot(info, id=f"{id}-loss" if id else None),
                      MetricPlot(info, "grad_norm", "gradient norm", "magenta"),
                      MetricPlot(info, "lr", "learning rate", "green"))

    def compose(self) -> ComposeResult:
        yield from self.plots

    def ingest(self, tick: Tick) -> None:
        for plot in self.plots:
            plot.ingest(tick)

    def redraw(self) -> None:
        for plot in self.plots:
            plot.redraw()
