"""Recorded text made safe to show: a run folder (its events, summary, names) may come from anyone, and a
terminal obeys the control sequences written to it (clear the screen, set the clipboard through OSC 52,
reorder a line with bidi overrides). `printable` shows every such character as a visible escape instead.

Every place that shows recorded text to a person passes it through here: the headless printers, the
command-line listings and error lines, and the workbench's panes. Markup is the display's own concern: the
workbench hands escaped text to Rich as `Text` (never parsed as markup).
"""

from __future__ import annotations

import re

# C0 controls, DEL and C1 controls; lone surrogates (JSON can hold them, and printing one raises); the line
# and paragraph separators; bidi marks, embeddings, overrides and isolates.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _NAMED.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def printable(text: object, newlines: bool = False) -> str:
    """`text` with every control or bidi character written as a visible escape (ESC as `\\x1b`); line breaks
    too, unless `newlines` keeps them (for text that is several lines by nature, such as a preset file)."""
    s = str(text)
    if s.isprintable():  # the common case: nothing to escape (isprintable is False for every unsafe one)
        return s
    if newlines:
        return "\n".join(_UNSAFE.sub(_escape, line) for line in s.split("\n"))
    return _UNSAFE.sub(_escape, s)
