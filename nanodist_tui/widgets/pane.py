"""The contract between the app and every pane it feeds, declared once."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from nanodist_tui.messages import Tick


@runtime_checkable
class Pane(Protocol):
    """A widget the app feeds every Tick and redraws on its render timer.

    Ticks arrive up to ~10 times a second, the render timer fires about once a second (the app's
    pane_interval_s; plots draw every PLOT_EVERY-th time), and pausing the display stops the redraws but not
    the ticks. Hence the two halves:

    - `ingest(tick)` stores what the tick brings (and notes that there is something to draw); it never
      draws, so a burst of ticks costs no rendering and a paused display loses nothing.
    - `redraw()` draws what was stored since the last redraw: only when something is new (it returns at
      once otherwise), and, where drawing is costly (plots, memory bars, rank table), only on screen.
    """

    def ingest(self, tick: Tick) -> None: ...

    def redraw(self) -> None: ...
