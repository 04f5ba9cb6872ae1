"""One per-step figure of StepEnd over steps (gradient norm, learning rate), for the curves pane."""

from __future__ import annotations

import math

from engine import events
from nanodist_tui.messages import Tick
from nanodist_tui.run_info import RunInfo
from nanodist_tui.widgets.history import History
from nanodist_tui.widgets.live_plot import LivePlot

HISTORY_COLUMNS = {"loss": 1, "lr": 2, "grad_norm": 3}  # where History.steps keeps each StepEnd field


class MetricPlot(LivePlot):
    def __init__(self, info: RunInfo, field: str, title: str, color: str, *, id: str | None = None) -> None:
        super().__init__(info, id=id)
        self.field, self.color = field, color
        self.border_title = title
        self.PLACEHOLDER = f"no {title} yet: waiting for the first step"
        self.history = History()

    def on_mount(self) -> None:
        self.plt.xlabel("step")

    def collect(self, tick: Tick) -> bool:
        changed = False
        column = HISTORY_COLUMNS.get(self.field)
        for event in tick.events:
            # a resumed run's lineage comes first
            if isinstance(event, events.History) and column is not None:
                self.lineage_start(event)
                for point in event.steps:
                    self.history.append(point[0], point[column])
                    self.y_range.include([point[column]])
                changed = True
        for step in tick.steps:
            value = getattr(step, self.field)
            if not step.skipped and value is not None and math.isfinite(value):
                self.history.append(step.step, value)
                self.y_range.include([value])
                changed = True
        return changed

    def has_data(self) -> bool:
        return bool(len(self.history))

    def draw(self, max_points: int) -> None:
        xs, ys = self.history.points(max_points)
        self.plt.plot(xs, ys, marker=self.marker, color=self.color)
        self.step_axis(int(xs[-1]))
        self.value_axis()
