"""Loss scale on a log axis over the steps tried, with a marker at every overflow.

An overflowing step is skipped: the step counter does not move, so several attempts can share one step
number. The x axis therefore counts attempts (the run's first step plus every step tried, skipped ones
included), which equals the step number until the first skip, and each overflow gets its own place."""

from __future__ import annotations

import math
from collections import deque

from engine.events import LossScaleChange
from nanodist_tui.messages import Tick
from nanodist_tui.run_info import RunInfo
from nanodist_tui.widgets.glyphs import glyphs_of
from nanodist_tui.widgets.history import History
from nanodist_tui.widgets.live_plot import LivePlot

# LossScaleChange reasons that mean the step's gradients were not finite (hysteresis: an overflow
# that did not lower the scale yet).
OVERFLOW_REASONS = ("inf", "nan", "hysteresis")


class LossScalePlot(LivePlot):
    PLACEHOLDER = "no loss scale yet: waiting for the first step"

    def __init__(self, info: RunInfo, *, id: str | None = None) -> None:
        super().__init__(info, id=id)
        self.scale = History()
        self.attempts = 0
        self._skipped_at: deque[int] = deque()  # attempts that were skipped, waiting for their overflow event
        self.overflows: deque[tuple[int, float]] = deque(maxlen=1024)  # (attempt, scale that overflowed)

    def on_mount(self) -> None:
        self.plt.xlabel("steps tried (skipped included)")
        self.plt.yscale("log")

    def collect(self, tick: Tick) -> bool:
        changed = False
        for step in tick.steps:
            self.attempts += 1
            x = self.info.first_step + self.attempts
            if step.skipped:
                self._skipped_at.append(x)
            if step.loss_scale is not None and step.loss_scale > 0:  # a log axis needs positive values
                self.scale.append(x, step.loss_scale)
                changed = True
        for event in tick.events:
            if isinstance(event, LossScaleChange) and event.reason in OVERFLOW_REASONS:
                x = self._skipped_at.popleft() if self._skipped_at else self.info.first_step + self.attempts
                self.overflows.append((x, event.old_scale))
                changed = True
        return changed

    def has_data(self) -> bool:
        return bool(len(self.scale))

    def draw(self, max_points: int) -> None:
        xs, ys = self.scale.points(max_points)
        self.plt.plot(xs, ys, label=self.legend("scale"), marker=self.marker, color="cyan")
        if self.overflows:
            steps, scales = zip(*self.overflows, strict=True)
            self.plt.scatter(list(steps), list(scales), label=self.legend("overflow"),
                             marker=glyphs_of(self).points, color="red")
            ys = [*ys, *scales]
        self.step_axis(int(max(xs[-1], *(x for x, _ in self.overflows))) if self.overflows else int(xs[-1]))
        # Scales are powers of two: label them as such (2^16 = 65536) instead of with plotext's decimals.
        low, high = math.floor(math.log2(max(min(ys), 1e-30))), math.ceil(math.log2(max(max(ys), 1e-30)))
        # (no ylim: plotext's log axis mishandles explicit limits)
        step = max(1, (high - low) // max(2, self.size.height // 3))
        powers = list(range(low, high + 1, step))
        labels = [f"2^{k}" for k in powers]
        width = max(len(label) for label in labels)
        self.plt.yticks([2.0**k for k in powers], [label.rjust(width) for label in labels])
