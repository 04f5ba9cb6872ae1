"""The sweep pane's plots: the optimization history (each complete trial's value and the best so far),
the intermediate values (what the pruner sees) of the running trial beside the few before it, and the
Pareto front of two metrics.

Each is a LivePlot: `collect` stores what a tick's trial events bring, `draw` plots it. They learn the
metrics and directions from the SweepStarted event.
"""

from __future__ import annotations

import math

from rich.text import Text

from engine.events import SweepStarted, TrialFinished, TrialReport, TrialStarted
from engine.run.printable import printable
from nanodist_tui.messages import Tick
from nanodist_tui.widgets.glyphs import glyphs_of
from nanodist_tui.widgets.live_plot import LivePlot

MAX_CURVES = 4  # the latest trials drawn: the running one(s) and those just before, to compare
COLORS = ("cyan", "orange", "green", "magenta")


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


class HistoryPlot(LivePlot):
    """The first metric of every complete trial by trial number, and the best value so far."""

    PLACEHOLDER = "no complete trial yet"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = "history"
        self.metric = ""
        self.trials: dict[int, float] = {}
        self.best: dict[int, float] = {}  # trial number -> the best value once it finished

    def on_mount(self) -> None:
        self.plt.xlabel("trial")

    def collect(self, tick: Tick) -> bool:
        changed = False
        for e in tick.events:
            if isinstance(e, SweepStarted):
                self.metric = printable(e.metrics[0])  # a name is anyone's text: escaped, never markup
                self.border_title = Text(f"history · {self.metric}")
            elif isinstance(e, TrialFinished):
                if e.state == "complete" and e.values and _finite(e.values[0]):
                    self.trials[e.number] = e.values[0]
                    changed = True
                if e.best_values and _finite(e.best_values[0]):
                    self.best[e.number] = e.best_values[0]
        return changed

    def has_data(self) -> bool:
        return bool(self.trials)

    def draw(self, max_points: int) -> None:
        numbers = sorted(self.trials)
        self.count_axis(max([*numbers, *self.best]))  # trial numbers count from 0: whole ticks only
        self.plt.scatter(numbers, [self.trials[n] for n in numbers], label=self.metric,
                         marker=glyphs_of(self).dots, color="cyan")
        if self.best:
            steps = sorted(self.best)
            self.plt.plot(steps, [self.best[n] for n in steps], label="best so far", marker=self.marker,
                          color="green")


class IntermediatePlot(LivePlot):
    """The values the latest trials reported at their evaluations, by training step."""

    PLACEHOLDER = "no evaluation reported yet"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = "intermediate values"
        self.metric = ""
        self.running: dict[int, list[tuple[int, float]]] = {}  # trial number -> (step, value), oldest first

    def on_mount(self) -> None:
        self.plt.xlabel("step")

    def collect(self, tick: Tick) -> bool:
        changed = False
        for e in tick.events:
            if isinstance(e, SweepStarted):
                self.metric = printable(e.metrics[0])
                self.border_title = Text(f"intermediate values · {self.metric}")
            elif isinstance(e, TrialStarted):
                self.running[e.number] = []
                while len(self.running) > MAX_CURVES:
                    self.running.pop(min(self.running))
                changed = True
            elif isinstance(e, TrialReport) and e.number in self.running and _finite(e.value):
                self.running[e.number].append((e.step, e.value))
                changed = True
        return changed

    def has_data(self) -> bool:
        return any(self.running.values())

    def draw(self, max_points: int) -> None:
        last = max((step for points in self.running.values() for step, _ in points), default=1)
        self.count_axis(last)  # training steps: whole ticks from 0, as the history's trials
        for color, (number, points) in zip(COLORS, self.running.items()):
            if points:
                steps, values = zip(*points, strict=True)
                self.plt.plot(list(steps), list(values), label=f"trial {number}", marker=self.marker,
                              color=color)


class ParetoPlot(LivePlot):
    """Two metrics of every complete trial against each other, the Pareto front marked."""

    PLACEHOLDER = "no complete trial yet"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = "Pareto front"
        self.metrics: list[str] = []
        self.points: dict[int, tuple[float, float]] = {}
        self.front: list[int] = []

    def collect(self, tick: Tick) -> bool:
        changed = False
        for e in tick.events:
            if isinstance(e, SweepStarted):
                self.metrics = [printable(m) for m in e.metrics[:2]]
                self.border_title = Text(f"Pareto front · {' vs '.join(self.metrics)}")
            elif isinstance(e, TrialFinished):
                pair = (e.values or [])[:2]
                if e.state == "complete" and len(pair) == 2 and all(map(_finite, pair)):
                    self.points[e.number] = (pair[0], pair[1])
                self.front = list(e.best or [])
                changed = True
        return changed

    def has_data(self) -> bool:
        return bool(self.points)

    def draw(self, max_points: int) -> None:
        if self.metrics:
            self.plt.xlabel(self.metrics[0])
            self.plt.ylabel(self.metrics[1])
        others = [p for n, p in self.points.items() if n not in self.front]
        front = sorted(p for n, p in self.points.items() if n in self.front)
        if others:
            self.plt.scatter([p[0] for p in others], [p[1] for p in others], label="trials",
                             marker=glyphs_of(self).dots,
                             color="gray")
        if front:
            self.plt.plot([p[0] for p in front], [p[1] for p in front], label="front", marker=self.marker,
                          color="green")
            self.plt.scatter([p[0] for p in front], [p[1] for p in front], marker="x", color="green")
