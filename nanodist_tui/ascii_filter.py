"""ASCII mode's last word: a Textual line filter that turns every character still outside ASCII into one.

The panes draw with ASCII glyphs of their own in ASCII mode (widgets/glyphs.py), but much of what is on screen
is drawn by others: Textual's borders, tab underline, scrollbars and footer, plotext's frames, and text
written with '·' or '×'. The filter sees every line every widget renders (App.get_line_filters), so nothing
escapes it. Each character keeps its one cell: box drawing becomes - | +, blocks # _ |, braille *, arrows
< > ^ v; anything else outside ASCII becomes '?' (two for a wide character).
"""

from __future__ import annotations

import re

from rich.cells import cell_len
from rich.segment import Segment
from textual.color import Color
from textual.filter import LineFilter

_SINGLE = {
    "·": ".", "•": "*", "×": "x", "…": ".", "—": "-", "–": "-", "−": "-", "±": "+", "°": "o", "µ": "u",
    "▶": ">", "►": ">", "→": ">", "◀": "<", "◄": "<", "←": "<", "▼": "v", "↓": "v", "▲": "^", "↑": "^",
    "⏎": "<", "↵": "<", "✓": "v", "✗": "x", "✔": "v", "✘": "x", "●": "o", "○": "o", "■": "#", "□": "#",
    "\u00a0": " ",
}
_HORIZONTAL = "─━═┄┅┈┉╌╍╴╶╸╺╼╾"
_VERTICAL = "│┃║┆┇┊┋╎╏╵╷╹╻╽╿"


def _table() -> dict[int, str]:
    table = {ord(k): v for k, v in _SINGLE.items()}
    for code in range(0x2500, 0x2580):  # box drawing: lines, then corners, tees and crosses
        c = chr(code)
        table[code] = "-" if c in _HORIZONTAL else "|" if c in _VERTICAL else "+"
    for code in range(0x2580, 0x25A0):  # block elements
        c = chr(code)
        table[code] = "_" if c in "▁▂" else "-" if c == "▔" else "|" if c in "▏▎▍▌▐▕" else "#"
    table[0x2800] = " "  # the empty braille cell
    for code in range(0x2801, 0x2900):
        table[code] = "*"
    return table


TABLE = _table()
_OTHER = re.compile(r"[^\x00-\x7f]")


def to_ascii(text: str) -> str:
    """`text` with every character in ASCII, cell for cell (the filter's rule; plain text may use it too)."""
    if text.isascii():
        return text
    return _OTHER.sub(lambda m: "?" * max(1, cell_len(m.group())), text.translate(TABLE))  # a wide one: ??


class AsciiFilter(LineFilter):
    def apply(self, segments: list[Segment], background: Color) -> list[Segment]:
        return [segment if segment.text.isascii() else Segment(to_ascii(segment.text), segment.style,
                                                                  segment.control)
                for segment in segments]
