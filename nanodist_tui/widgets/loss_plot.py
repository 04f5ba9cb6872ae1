"""Train and validation loss over steps."""

from __future__ import annotations

import math

from engine.events import Eval
from nanodist_tui.messages import Tick
from nanodist_tui.widgets.history import History
from nanodist_tui.widgets.live_plot import LivePlot


class LossPlot(LivePlot):
    PLACEHOLDER = "no loss yet: waiting for the first step"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
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
                if self.train.starts_over(step.step):  # a sweep's next trial
                    self.train.clear()
                self.train.append(step.step, step.loss)
                changed = True
        for event in tick.events:
            if isinstance(event, Eval) and math.isfinite(event.val_loss):
                if self.val.starts_over(event.step):
                    self.val.clear()
                self.val.append(event.step, event.val_loss)
                changed = True
        return changed

    def has_data(self) -> bool:
        return bool(len(self.train) or len(self.val))

    def draw(self, max_points: int) -> None:
        for name, history, color in (("train", self.train, "cyan"), ("val", self.val, "orange")):
            if len(history):
                xs, ys = history.points(max_points)
                self.plt.plot(xs, ys, label=name, marker="braille", color=color)
