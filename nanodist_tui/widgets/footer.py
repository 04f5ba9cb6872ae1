"""The footer every screen of the workbench shows: Textual's, fitted to the terminal's width."""

from __future__ import annotations

from textual.widgets import Footer

NARROW_BELOW = 120  # columns; narrower, the keys fit only without padding and the palette's own entry


class WorkbenchFooter(Footer):
    """At 80 columns a full footer cut its last keys off (`f Fre▏`): narrower than NARROW_BELOW it drops its
    padding and its `^p palette` entry (ctrl+p still opens the palette, and the help names it)."""

    def on_mount(self) -> None:
        self.fit(self.app.size.width)

    def fit(self, width: int) -> None:
        self.compact = width < NARROW_BELOW
        self.show_command_palette = width >= NARROW_BELOW
