"""The footer every screen of the workbench shows: Textual's, fitted to the terminal's width."""

from __future__ import annotations

from textual.widget import Widget
from textual.widgets import Footer
from textual.widgets._footer import FooterKey, FooterLabel, KeyGroup

NARROW_BELOW = 120  # columns; narrower, the keys fit only without padding and the palette's own entry


def compact_width(item: Widget) -> int:
    """Columns one footer entry takes in the compact footer (its trailing space included): a key is
    `k Label `, a group's keys `+- `, its label `Speed `."""
    if isinstance(item, FooterKey):
        label = f" {item.description}" if item.description else ""
        return len(item.key_display) + len(label) + 1
    if isinstance(item, KeyGroup):
        return sum(len(key.key_display) for key in item.children if isinstance(key, FooterKey)) + 1
    if isinstance(item, FooterLabel):
        return len(str(item.content)) + 1
    return 0


class WorkbenchFooter(Footer):
    """At 80 columns a full footer cut its last keys off (`f Fre▏`): narrower than NARROW_BELOW it drops its
    padding and its `^p palette` entry (ctrl+p still opens the palette, and the help names it), and should
    the keys still not fit, it shows those that do, whole, in their order (the bindings list what the moment
    needs first; `?` lists them all)."""

    def on_mount(self) -> None:
        self.fit(self.app.size.width)

    def fit(self, width: int) -> None:
        self.compact = width < NARROW_BELOW
        self.show_command_palette = not self.compact
        self._show_what_fits(list(self.children), width)

    async def recompose(self) -> None:
        # Textual's footer composes its keys again whenever the bindings change (a screen, a focus)
        await super().recompose()
        self._show_what_fits(list(self.children), self.app.size.width)

    def _show_what_fits(self, items: list[Widget], width: int) -> None:
        room = width
        for item in items:
            room -= compact_width(item)
            # the last entry's trailing space may fall off the edge
            item.display = not self.compact or room >= -1
