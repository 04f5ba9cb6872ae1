"""Loss-scale pane (fp16 runs only): the scale plot above a log of every scale change."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical

from engine.events import LossScaleChange
from nanodist_tui.describe import describe_loss_scale
from nanodist_tui.messages import Tick
from nanodist_tui.run_info import RunInfo
from nanodist_tui.widgets.line_log import LineLog
from nanodist_tui.widgets.loss_scale_plot import OVERFLOW_REASONS, LossScalePlot


class LossScalePane(Vertical):
    """Feeds the plot and keeps the change log; the border title counts overflows and skipped steps."""

    def __init__(self, info: RunInfo, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = "loss scale"
        self.skipped_steps = 0
        self.overflows = 0
        self.plot = LossScalePlot(info)
        self.changes = LineLog(max_lines=500, classes="loss-scale-log")

    def compose(self) -> ComposeResult:
        yield self.plot
        yield self.changes

    def ingest(self, tick: Tick) -> None:
        self.plot.ingest(tick)
        self.skipped_steps += sum(1 for step in tick.steps if step.skipped)
        for event in tick.events:
            if isinstance(event, LossScaleChange):
                self.overflows += event.reason in OVERFLOW_REASONS
                self.changes.queue(describe_loss_scale(event))

    def redraw(self) -> None:
        self.plot.redraw()
        self.border_title = f"loss scale · {self.overflows} overflows · {self.skipped_steps} skipped"
        self.changes.write_queued()
