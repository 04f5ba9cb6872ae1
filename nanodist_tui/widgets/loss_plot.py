"""Train and validation loss over steps."""

from __future__ import annotations

import math

from engine import events
from engine.events import Eval
from nanodist_tui.messages import Tick
from nanodist_tui.run_info import RunInfo
from nanodist_tui.widgets.history import History
from nanodist_tui.widgets.live_plot import LivePlot


class LossPlot(LivePlot):
    PLACEHOLDER = "no loss yet: waiting for the first step"

    def __init__(self, info: RunInfo, *, id: str | None = None) -> None:
        super().__init__(info, id=id)
        self.border_title = "loss"
        self.train = History()
        self.val = History()

    def on_mount(self) -> None:
        self.plt.xlabel("step")

    def collect(self, tick: Tick) -> bool:
        changed = False
        for step in tick.steps:
            # Skipped (overflowed) steps carry no usable loss.
            if not step.skipped and math.isfinite(step.loss):
                self.train.append(step.step, step.loss)
                self.y_range.include([step.loss])
                changed = True
        for event in tick.events:
            if isinstance(event, events.History):  # a resumed run: its lineage's curves come first
                self.lineage_start(event)
                for step, loss, *_ in event.steps:
                    self.train.append(step, loss)
                    self.y_range.include([loss])
                for step, val_loss in event.evals:
                    self.val.append(step, val_loss)
                    self.y_range.include([val_loss])
                changed = True
            elif isinstance(event, Eval) and math.isfinite(event.val_loss):
                self.val.append(event.step, event.val_loss)
                self.y_range.include([event.val_loss])
                changed = True
        return changed

    def has_data(self) -> bool:
        return bool(len(self.train) or len(self.val))

    def draw(self, max_points: int) -> None:
        last = 0
        for name, history, color in (("train", self.train, "cyan"), ("val", self.val, "orange")):
            if len(history):
                xs, ys = history.points(max_points)
                self.plt.plot(xs, ys, label=self.legend(name), marker=self.marker, color=color)
                last = max(last, int(xs[-1]))
        self.step_axis(last)
        self.value_axis()
