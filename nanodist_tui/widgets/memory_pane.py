"""Per-rank memory: one stacked bar per rank by category, a peak marker and the estimate beside it."""

from __future__ import annotations

import re

from rich.text import Text
from textual.widgets import Static

from engine.events import MemorySnapshot
from nanodist_tui.messages import Tick
from nanodist_tui.widgets.units import format_bytes

# Display order, label and colour per category; colours follow PyTorch's memory timeline
# (parameters dark green, gradients blue, optimizer state golds, activations red, temporaries purple).
CATEGORIES = {
    "parameters": ("params", "#2e8b2e"),
    "gradients": ("grads", "#3050e0"),
    "optimizer_master": ("master", "#daa520"),
    "optimizer_m": ("adam m", "#b8860b"),
    "optimizer_v": ("adam v", "#f0c040"),
    "activations": ("activations", "#e03030"),
    "comm_buffers": ("comm buffers", "#20b2aa"),
    "temporaries": ("temporaries", "#9370db"),
}
# Short names a ledger may use for the same categories.
ALIASES = {
    "params": "parameters",
    "grads": "gradients",
    "master": "optimizer_master",
    "m": "optimizer_m",
    "adam_m": "optimizer_m",
    "v": "optimizer_v",
    "adam_v": "optimizer_v",
    "comm": "comm_buffers",
    "temps": "temporaries",
}
OTHER_COLOR = "#808080"
LABEL_WIDTH = 8  # "rank 12 "
NUMBERS_WIDTH = 42  # " 123.4 MiB  peak 123.4 MiB  est 123.4 MiB"


def canonical(category: str) -> str:
    key = re.sub(r"[^a-z0-9]+", "_", category.lower()).strip("_")
    return ALIASES.get(key, key)


def style_of(category: str) -> tuple[str, str]:
    """(label, colour) of a category; unknown categories keep their own name and a grey."""
    return CATEGORIES.get(canonical(category), (category, OTHER_COLOR))


def ordered(amounts: dict[str, int]) -> list[tuple[str, int]]:
    """Categories in display order (known ones first, then the rest by name), without any 'total'."""
    order = list(CATEGORIES)

    def position(item: tuple[str, int]) -> tuple[int, str]:
        key = canonical(item[0])
        return (order.index(key) if key in CATEGORIES else len(order), key)

    return sorted(((k, v) for k, v in amounts.items() if canonical(k) != "total"), key=position)


def total(amounts: dict[str, int] | None) -> int:
    if not amounts:
        return 0
    return amounts.get("total") or sum(v for _, v in ordered(amounts))


def bar(snapshot: MemorySnapshot, scale: int, width: int) -> Text:
    """A stacked bar `width` cells wide, where `scale` bytes fill it; '┃' marks the peak."""
    text = Text()
    filled = 0
    running = 0
    for category, amount in ordered(snapshot.current):
        running += amount
        end = round(running / scale * width) if scale else 0  # cumulative rounding: no drift
        text.append("█" * (end - filled), style=style_of(category)[1])
        filled = end
    # The peak is never below the current total, so its marker sits in the empty part of the bar.
    peak_at = max(filled, min(width - 1, round(total(snapshot.peak) / scale * width) if scale else 0))
    text.append("·" * (peak_at - filled), style="dim")
    if peak_at < width:
        text.append("┃", style="bold")
        text.append("·" * (width - peak_at - 1), style="dim")
    return text


class MemoryPane(Static):
    """Redrawn by the app's render timer when a new snapshot arrived."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("no memory snapshot yet", id=id, classes="placeholder")
        self.border_title = "memory per rank"
        self.snapshots: dict[int, MemorySnapshot] = {}
        self._dirty = False

    def ingest(self, tick: Tick) -> None:
        if any(self.snapshots.get(rank) is not snap for rank, snap in tick.memory.items()):
            self.snapshots = tick.memory
            self._dirty = True

    def on_resize(self) -> None:
        self._dirty = bool(self.snapshots)

    def redraw(self) -> None:
        if not self._dirty or not self.is_on_screen:
            return
        self._dirty = False
        self.remove_class("placeholder")
        self.update(self.render_snapshots(self.size.width))

    def render_snapshots(self, width: int) -> Text:
        snaps = [self.snapshots[rank] for rank in sorted(self.snapshots)]
        scale = max(max(total(s.current), total(s.peak), total(s.estimate)) for s in snaps)
        bar_width = max(10, width - LABEL_WIDTH - NUMBERS_WIDTH)
        out = Text()
        seen: dict[str, None] = {}
        for s in snaps:
            seen.update(dict.fromkeys(k for k, _ in ordered(s.current)))
        for category in seen:
            label, color = style_of(category)
            out.append("■ ", style=color)
            out.append(f"{label}  ")
        out.append("┃ peak\n", style="bold")
        for s in snaps:
            out.append(f"rank {s.rank:<3}", style="bold")
            out.append(bar(s, scale, bar_width))
            out.append(f" {format_bytes(total(s.current)):>9}  peak {format_bytes(total(s.peak)):>9}")
            if s.estimate:
                out.append(f"  est {format_bytes(total(s.estimate)):>9}", style="italic")
            out.append("\n")
            parts = [f"{style_of(k)[0]} {format_bytes(v)}" for k, v in ordered(s.current)]
            out.append(" " * LABEL_WIDTH + " · ".join(parts) + f"  (step {s.step}, {s.phase})\n", style="dim")
        everything = sum(total(s.current) for s in snaps)
        out.append(f"total over {len(snaps)} rank(s): {format_bytes(everything)}", style="bold")
        return out
