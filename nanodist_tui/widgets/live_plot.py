"""Base for the live plots: redraw only when new data arrived and the plot is on screen, on axes that hold
still (widgets/axes.py)."""

from __future__ import annotations

from typing import cast

from rich.text import Text
from textual.app import RenderResult
from textual_plotext import PlotextPlot

from engine.events import History
from nanodist_tui.messages import Tick
from nanodist_tui.run_info import RunInfo
from nanodist_tui.widgets.axes import GrowingRange, step_ticks, value_ticks
from nanodist_tui.widgets.glyphs import glyphs_of

MIN_HEIGHT, MIN_WIDTH = 5, 20  # below this plotext has no room for a curve
LEGEND_MIN_HEIGHT = 8


class LivePlot(PlotextPlot):
    """A plotext plot fed by ticks and redrawn by the app's render timer (every other time it fires).

    A full plotext build costs tens of milliseconds, so `redraw` does nothing unless `ingest`
    brought new data (or the size changed) and the widget is on screen; `draws` counts the builds.
    Subclasses implement `collect` (update histories from a tick, return True if anything
    changed), `has_data` and `draw` (plot at most ~`max_points` points per curve).
    """

    PLACEHOLDER = "no data yet"

    def __init__(self, info: RunInfo | None = None, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.info = info or RunInfo()  # the run's shape: its step axis (plots of a sweep have none)
        self.y_range = GrowingRange()
        self.draws = 0
        self._dirty = False
        self._drawn = False  # plotext cannot build a figure without data: show the placeholder until then
        self._hidden = True  # off screen at the last redraw: draw as soon as it is on screen
        self._built: RenderResult = Text("")  # the last plotext build, and what it was built for
        self._built_for: tuple | None = None
        self.first_step: int | None = None  # where a resumed run's lineage starts (History), when earlier

    def collect(self, tick: Tick) -> bool:
        raise NotImplementedError

    def has_data(self) -> bool:
        raise NotImplementedError

    def draw(self, max_points: int) -> None:
        raise NotImplementedError

    def ingest(self, tick: Tick) -> None:
        if self.collect(tick):
            self._dirty = True

    def on_resize(self) -> None:
        self._dirty = True  # the downsampling and the ticks depend on the size

    @property
    def marker(self) -> str:
        return glyphs_of(self).plot_marker

    def redraw(self) -> None:
        if not self.is_on_screen:
            self._hidden = True
            return
        # Plots draw at a lower rate than the other panes (the app says when they are due): a plotext build
        # and its repaint cost more than a table's. A plot just brought on screen draws at once.
        due = getattr(self.app, "plots_due", True) or self._hidden
        if not (self._dirty and self.has_data() and due):
            return
        self._dirty = self._hidden = False
        self.plt.clear_data()
        # Braille cells hold two points per column: more points than that only cost build time.
        self.draw(max_points=2 * max(self.size.width, 1))
        self.draws += 1
        self._drawn = True
        self.refresh()

    def lineage_start(self, history: History) -> None:
        """A resumed run's curves start where its lineage does, not at the step it resumed from."""
        starts = [history.steps[0][0] - 1] if history.steps else []
        starts += [history.evals[0][0]] if history.evals else []
        if starts:
            self.first_step = min(starts)

    def step_axis(self, last_seen: int) -> None:
        """x from the run's first step (its lineage's, for a resumed run) to its last (or beyond, if a
        replay runs longer), whole numbers only."""
        first = self.info.first_step
        if self.first_step is not None:
            first = min(first, self.first_step)
        last = max(self.info.total_steps, last_seen, first + 1)
        self.plt.xlim(first, last)
        ticks = step_ticks(first, last, self.size.width)
        # textual_plotext's stub asks for list[float] (lists are invariant): whole numbers are numbers too
        self.plt.xticks(cast(list[float], ticks), [str(t) for t in ticks])

    def count_axis(self, last: int) -> None:
        """x over whole counts from 0 to `last` (at least 1): trial numbers, never a fractional or negative
        tick, however few points there are."""
        last = max(last, 1)
        self.plt.xlim(0, last)
        ticks = step_ticks(0, last, self.size.width)
        self.plt.xticks(cast(list[float], ticks), [str(t) for t in ticks])

    def value_axis(self) -> None:
        lo, hi = self.y_range.limits()
        self.plt.ylim(lo, hi)
        self.plt.yticks(*value_ticks(lo, hi, self.size.height))

    def legend(self, label: str) -> str | None:
        """A curve's legend label, or None when the plot is too small to hold a legend."""
        return label if self.size.height >= LEGEND_MIN_HEIGHT and self.size.width >= 30 else None

    def render(self) -> RenderResult:
        if not self._drawn:
            return Text(self.PLACEHOLDER, style="dim")
        if self.size.height < MIN_HEIGHT or self.size.width < MIN_WIDTH:
            return Text("too small to plot: give it more room (or its own tab)", style="dim")
        # Textual renders again whenever the screen is laid out or repainted around the plot; the figure only
        # changes with a draw, a size or a theme, so the plotext build of the last one is kept.
        key = (self.draws, self.size, self.app.theme)
        if key != self._built_for:
            try:
                self._built = super().render()
            except (IndexError, OverflowError, ValueError, ZeroDivisionError):  # plotext at odd sizes
                self._built = Text("cannot plot at this size: give it more room (or its own tab)",
                                   style="dim")
            self._built_for = key
        return self._built
