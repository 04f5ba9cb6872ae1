"""The contract between the app and every pane it feeds, declared once."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, cast, runtime_checkable

from nanodist_tui.messages import Tick

if TYPE_CHECKING:
    from textual.widget import Widget


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


def as_panes(widgets: list[Widget]) -> list[Pane]:
    """The widgets the PaneSpecs made (panes.py), as the Panes they are: the specs type what they make as a
    Widget, for the layout, and Python has no type for "a Widget that keeps Pane" (tests/workbench/test_app.py
    checks every pane the app feeds at run time). The same list: nothing is copied."""
    return cast("list[Pane]", widgets)
