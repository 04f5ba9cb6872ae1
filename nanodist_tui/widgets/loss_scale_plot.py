"""Loss scale over steps on a log axis, with a marker at every overflow."""

from __future__ import annotations

import math
from collections import deque

from engine.events import LossScaleChange
from nanodist_tui.messages import Tick
from nanodist_tui.widgets.history import History
from nanodist_tui.widgets.live_plot import LivePlot

# LossScaleChange reasons that mean the step's gradients were not finite (hysteresis: an overflow
# that did not lower the scale yet).
OVERFLOW_REASONS = ("inf", "nan", "hysteresis")


class LossScalePlot(LivePlot):
    PLACEHOLDER = "no loss scale: this run does not scale its loss, or has not stepped yet"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.scale = History()
        self.overflows: deque[tuple[int, float]] = deque(maxlen=1024)

    def on_mount(self) -> None:
        self.plt.xlabel("step")
        self.plt.yscale("log")

    def collect(self, tick: Tick) -> bool:
        changed = False
        for step in tick.steps:
            if step.loss_scale is not None and step.loss_scale > 0:  # a log axis needs positive values
                if self.scale.starts_over(step.step, repeats=True):  # skipped steps repeat theirs
                    self.scale.clear()
                    self.overflows.clear()
                self.scale.append(step.step, step.loss_scale)
                changed = True
        for event in tick.events:
            if isinstance(event, LossScaleChange) and event.reason in OVERFLOW_REASONS:
                self.overflows.append((event.step, event.old_scale))
                changed = True
        return changed

    def has_data(self) -> bool:
        return bool(len(self.scale))

    def draw(self, max_points: int) -> None:
        xs, ys = self.scale.points(max_points)
        self.plt.plot(xs, ys, label="scale", marker="braille", color="cyan")
        if self.overflows:
            steps, scales = zip(*self.overflows, strict=True)
            self.plt.scatter(list(steps), list(scales), label="overflow", marker="x", color="red")
            ys = [*ys, *scales]
        # Scales are powers of two: label those instead of plotext's evenly spaced decimals.
        low, high = math.floor(math.log2(max(min(ys), 1e-30))), math.ceil(math.log2(max(max(ys), 1e-30)))
        ticks = [2.0**k for k in range(low, high + 1)]
        step = max(1, len(ticks) // 6)
        self.plt.yticks(ticks[::step], [f"{t:g}" for t in ticks[::step]])
