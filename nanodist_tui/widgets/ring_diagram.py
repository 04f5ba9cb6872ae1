"""The ranks drawn as a ring, each link labelled with what it carried in the last step and how fast.

    [0] ── 1.6 MB 2.10 GB/s ──▶ [1]        N = 2: there and back
     ▲                           │
     └──◀── 1.6 MB 2.00 GB/s ────┘

    [0] ── 2.5 MB 1.21 GB/s ──▶ [1]        N >= 3: ranks 0..⌈N/2⌉-1 along the top, the rest back along
     ▲                           │ 2.5 MB  the bottom
     │ 2.5 MB                    ▼ 1.02 GB/s
     │ 0.98 GB/s
    [3] ◀── 2.5 MB 1.19 GB/s ── [2]

When every link carried the same bytes the labels keep only the rate (the caption gives the bytes); when even
that does not fit, `draw_ring` returns None and the pane lists the links instead. Pure rich Text.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet

from rich.text import Text

from nanodist_tui.traffic import Link
from nanodist_tui.widgets.glyphs import Glyphs
from nanodist_tui.widgets.units import format_bytes, format_rate

SLOW_STYLE = "bold red"


class _Canvas:
    def __init__(self, rows: int, cols: int) -> None:
        self.cells: list[list[tuple[str, str]]] = [[(" ", "")] * cols for _ in range(rows)]

    def put(self, row: int, col: int, text: str, style: str = "") -> None:
        line = self.cells[row]
        for i, ch in enumerate(text):
            if 0 <= col + i < len(line):
                line[col + i] = (ch, style)

    def lines(self) -> list[Text]:
        out = []
        for line in self.cells:
            text = Text()
            for ch, style in line:
                text.append(ch, style)
            text.rstrip()
            out.append(text)
        return out


def _labels(link: Link | None, with_bytes: bool) -> list[str]:
    if link is None:
        return ["-"]
    rate = format_rate(link.rate)
    return [format_bytes(link.bytes), rate] if with_bytes else [rate]


def draw_ring(world: int, links: dict[tuple[int, int], Link], width: int, glyphs: Glyphs,
              slow: AbstractSet[tuple[int, int]] = frozenset()) -> tuple[list[Text], bool] | None:
    """(lines, bytes shown on the links) of the ring's picture in at most `width` columns, or None."""
    ring = [links.get((r, (r + 1) % world)) for r in range(world)]
    carried = {link.bytes for link in ring if link is not None}
    for with_bytes in (True, False) if len(carried) <= 1 else (True,):
        drawn = (_draw_pair if world == 2 else _draw_loop)(world, ring, with_bytes, glyphs, slow)
        if max(len(line) for line in drawn) <= width:
            return drawn, with_bytes
    return None


def _rightwards(label: str, seg: int, g: Glyphs) -> str:
    """A link `seg` columns long pointing right: " ─ label ───▶ "."""
    body = f" {g.line} {label} "
    return body + g.line * (seg - len(body) - 2) + g.right + " "


def _leftwards(label: str, seg: int, g: Glyphs) -> str:
    """A link `seg` columns long pointing left: " ◀─ label ─── "."""
    body = f" {g.left}{g.line} {label} "
    return body + g.line * (seg - len(body) - 1) + " "


def _style(link: Link | None, slow) -> str:
    return SLOW_STYLE if link is not None and (link.src, link.dst) in slow else ""


def _draw_pair(world, ring, with_bytes, g: Glyphs, slow) -> list[Text]:
    there, back = (" ".join(_labels(link, with_bytes)) for link in ring)
    seg = max(len(there), len(back)) + 8
    canvas = _Canvas(3, seg + 6)
    canvas.put(0, 0, "[0]", "bold")
    canvas.put(0, 3, _rightwards(there, seg, g), _style(ring[0], slow))
    canvas.put(0, seg + 3, "[1]", "bold")
    canvas.put(1, 1, g.up)
    canvas.put(1, seg + 4, _vertical(g))
    bottom = _leftwards(back, seg + 2, g).strip().ljust(seg + 2, g.line)
    canvas.put(2, 1, _corner(g, "bl") + bottom + _corner(g, "br"), _style(ring[1], slow))
    return canvas.lines()


def _vertical(g: Glyphs) -> str:
    return "|" if g.line == "-" else "│"


def _corner(g: Glyphs, which: str) -> str:
    if g.line == "-":
        return "+"
    return {"bl": "└", "br": "┘"}[which]


def _draw_loop(world, ring, with_bytes, g: Glyphs, slow) -> list[Text]:
    a = -(-world // 2)
    b = world - a
    rank_w = len(f"[{world - 1}]")
    top_labels = [" ".join(_labels(ring[j], with_bytes)) for j in range(a - 1)]
    # bottom links go leftwards: the link leaving rank (a + k) is drawn between its column and the next left
    bottom_cols = {c: a + (a - 1 - c) for c in range(a - b, a)}
    bottom_labels = [" ".join(_labels(ring[bottom_cols[c + 1]], with_bytes)) for c in range(a - b, a - 1)]
    odd_return = a - b == 1
    if odd_return:
        bottom_labels.append(" ".join(_labels(ring[world - 1], with_bytes)))
    seg = max([len(s) for s in top_labels + bottom_labels] + [3]) + 8
    pitch = rank_w + seg
    x = [c * pitch for c in range(a)]
    mid = rank_w // 2
    right = _labels(ring[a - 1], with_bytes)
    left = [] if odd_return else _labels(ring[world - 1], with_bytes)
    cols = x[-1] + rank_w + 2 + max(len(s) for s in right) + 1
    canvas = _Canvas(5, cols)
    vertical = _vertical(g)
    for j in range(a):  # the top row, left to right
        canvas.put(0, x[j], f"[{j}]".ljust(rank_w), "bold")
        if j < a - 1:
            canvas.put(0, x[j] + rank_w, _rightwards(top_labels[j], seg, g), _style(ring[j], slow))
    for c, rank in bottom_cols.items():  # the bottom row, links pointing left
        canvas.put(4, x[c], f"[{rank}]".ljust(rank_w), "bold")
        if c > a - b:
            label = bottom_labels[c - (a - b) - 1]
            canvas.put(4, x[c - 1] + rank_w, _leftwards(label, seg, g), _style(ring[rank], slow))
    # right side: rank a-1 down to rank a
    rx = x[a - 1] + mid
    canvas.put(1, rx, vertical)
    canvas.put(2, rx, vertical if len(right) > 1 else g.down)
    canvas.put(3, rx, g.down if len(right) > 1 else " ")
    for i, text in enumerate(right):
        canvas.put(2 + i, rx + 2, text, _style(ring[a - 1], slow))
    # left side: the last rank back to rank 0
    lx = x[0] + mid
    canvas.put(1, lx, g.up, _style(ring[world - 1], slow))
    canvas.put(2, lx, vertical)
    canvas.put(3, lx, vertical)
    if odd_return:  # rank N-1 sits in column 1: its link runs left along the bottom, then up
        label = bottom_labels[-1]
        back = _corner(g, "bl") + _leftwards(label, x[1] - lx, g)[1:]
        canvas.put(4, lx, back, _style(ring[world - 1], slow))
    else:
        for i, text in enumerate(left):
            canvas.put(2 + i, lx + 2, text, _style(ring[world - 1], slow))
    return canvas.lines()
