"""The characters the panes draw with: Unicode by default, plain ASCII for terminals or fonts without braille
and block characters (`--ascii`, NANODIST_ASCII=1, or `ascii = true` under [display] in the user config).

With NO_COLOR set (Textual then drops every colour) the memory bars fill each category with its own letter,
so the categories can still be told apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from textual.widget import Widget

    from nanodist_tui.app import NanoDistApp


@dataclass(frozen=True)
class Glyphs:
    block: str  # a filled bar cell
    track: str  # an empty bar cell
    mark: str  # the run-peak mark on a memory bar
    right: str  # ring links
    left: str
    down: str
    up: str
    line: str
    plot_marker: str  # plotext's marker for curves
    points: str  # plotext's marker for single events (overflows)
    dots: str  # plotext's marker for scattered values (a sweep's trials)
    letters: bool = False  # fill bars with each category's letter instead of a coloured block

    def fill(self, letter: str) -> str:
        return letter if self.letters else self.block

    def monochrome(self) -> Glyphs:
        return Glyphs(**{**self.__dict__, "letters": True})


UNICODE = Glyphs(block="█", track="·", mark="┃", right="▶", left="◀", down="▼", up="▲", line="─",
                 plot_marker="braille", points="x", dots="dot")
ASCII = Glyphs(block="#", track=".", mark="|", right=">", left="<", down="v", up="^", line="-",
               plot_marker="*", points="x", dots="o", letters=True)


def choose(ascii_only: bool, no_color: bool) -> Glyphs:
    glyphs = ASCII if ascii_only else UNICODE
    return glyphs.monochrome() if no_color else glyphs


def glyphs_of(widget: Widget) -> Glyphs:
    """The glyphs the workbench chose for the panes (NanoDistApp.glyphs), for one of them: Textual types a
    widget's `app` as any App."""
    return cast("NanoDistApp", widget.app).glyphs
