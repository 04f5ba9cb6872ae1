"""Base for the live plots: redraw only when new data arrived and the plot is on screen."""

from __future__ import annotations

from rich.text import Text
from textual.app import RenderResult
from textual_plotext import PlotextPlot

from nanodist_tui.messages import Tick


class LivePlot(PlotextPlot):
    """A plotext plot fed by ticks and redrawn by the app's render timer (a few times a second).

    A full plotext build costs tens of milliseconds, so `redraw` does nothing unless `ingest`
    brought new data (or the size changed) and the widget was on screen in the last update.
    Subclasses implement `collect` (update histories from a tick, return True if anything
    changed), `has_data` and `draw` (plot at most ~`max_points` points per curve).
    """

    PLACEHOLDER = "no data yet"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._dirty = False
        self._drawn = False  # plotext cannot build a figure without data: show the placeholder until then

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
        self._dirty = True  # the downsampling depends on the width

    def redraw(self) -> None:
        if not (self._dirty and self.has_data() and self.is_on_screen):
            return
        self._dirty = False
        self.plt.clear_data()
        # Braille cells hold two points per column: more points than that only cost build time.
        self.draw(max_points=2 * max(self.size.width, 1))
        self._drawn = True
        self.refresh()

    def render(self) -> RenderResult:
        if not self._drawn:
            return Text(self.PLACEHOLDER, style="dim")
        return super().render()
