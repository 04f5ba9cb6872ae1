"""The projection screen (`j` in the workbench): the projection pane full-screen, over the live panes.

The app installs it once and keeps its pane among the panes it feeds, so the pane has the run's config and
recent step times whenever the screen is opened; `escape` (or `j`) returns to the run, `c` calibrates this
machine for the run's model.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Static

from nanodist_tui.widgets.projection_pane import ProjectionPane


class ProjectionScreen(Screen):
    BINDINGS = [
        Binding("escape,j", "app.pop_screen", "Back to the run"),
        Binding("c", "calibrate", "Calibrate this machine"),
    ]

    def __init__(self, pane: ProjectionPane) -> None:
        super().__init__()
        self.pane = pane

    def compose(self) -> ComposeResult:
        yield Static("projection: the run on a cluster you do not have", id="projection-title")
        yield self.pane
        yield Footer()

    def on_screen_resume(self) -> None:
        self.pane.redraw()

    def action_calibrate(self) -> None:
        self.pane.calibrate()
