"""Per-rank memory: the categories at the step's peak as one stacked bar per rank, the run's
high-water mark on it, and the estimator's figure beside the measurement."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from engine.events import MemorySnapshot
from engine.memory import CATEGORIES
from nanodist_tui.messages import Tick
from nanodist_tui.widgets.units import format_bytes

# Label and colour per ledger category; colours follow PyTorch's memory timeline (parameters
# green, gradients blue, optimizer state golds, activations red, temporaries purple).
STYLES = {
    "parameters": ("params", "#2e8b2e"),
    "gradients": ("grads", "#3050e0"),
    "master": ("fp32 master", "#daa520"),
    "adam_m": ("adam m", "#b8860b"),
    "adam_v": ("adam v", "#f0c040"),
    "activations": ("activations", "#e03030"),
    "comm_buffers": ("comm buffers", "#20b2aa"),
    "temporaries": ("temporaries", "#9370db"),
}
OTHER_COLOR = "#808080"
LABEL_WIDTH = 8  # "rank 12 "
NUMBERS_WIDTH = 58  # " peak 123.4 KiB (optimizer)  est 123.4 KiB, measured +12.3%"


def style_of(category: str) -> tuple[str, str]:
    """(label, colour); a category the ledger adds later keeps its own name and a grey."""
    return STYLES.get(category, (category, OTHER_COLOR))


def ordered(amounts: dict[str, int]) -> list[tuple[str, int]]:
    """Non-zero categories in the ledger's order, then any others by name."""

    def position(item: tuple[str, int]) -> tuple[int, str]:
        return (CATEGORIES.index(item[0]) if item[0] in CATEGORIES else len(CATEGORIES), item[0])

    return sorted(((k, v) for k, v in amounts.items() if v), key=position)


def total(amounts: dict[str, int] | None) -> int:
    return sum(amounts.values()) if amounts else 0


def bar(amounts: dict[str, int], mark: int, scale: int, width: int) -> Text:
    """`amounts` stacked in a bar `width` cells wide that `scale` bytes fill; '┃' at `mark` bytes."""
    text = Text()
    filled = running = 0
    for category, amount in ordered(amounts):
        running += amount
        end = round(running / scale * width)  # cumulative rounding: segments do not drift
        text.append("█" * (end - filled), style=style_of(category)[1])
        filled = end
    # The mark is the highest peak so far, never below this bar, so it sits past the filled part.
    mark_at = max(filled, min(width - 1, round(mark / scale * width)))
    text.append("·" * (mark_at - filled), style="dim")
    if mark_at < width:
        text.append("┃", style="bold")
        text.append("·" * (width - mark_at - 1), style="dim")
    return text


class MemoryPane(Static):
    """Keeps the latest snapshot per (rank, phase); redrawn by the app's render timer."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("no memory snapshot yet", id=id, classes="placeholder")
        self.border_title = "memory per rank"
        self.snapshots: dict[tuple[int, str], MemorySnapshot] = {}
        self.high_water: dict[int, int] = {}  # rank -> highest peak total seen in the run
        self._dirty = False

    def ingest(self, tick: Tick) -> None:
        for key, snap in tick.memory.items():
            if self.snapshots.get(key) is not snap:
                self.snapshots[key] = snap
                self.high_water[snap.rank] = max(self.high_water.get(snap.rank, 0), total(snap.peak))
                self._dirty = True

    def on_resize(self) -> None:
        self._dirty = bool(self.snapshots)

    def redraw(self) -> None:
        if not self._dirty or not self.is_on_screen:
            return
        self._dirty = False
        self.remove_class("placeholder")
        self.update(self.render_snapshots(self.size.width))

    def peaks(self) -> dict[int, MemorySnapshot]:
        """Per rank, the snapshot of the phase whose peak was highest."""
        worst: dict[int, MemorySnapshot] = {}
        for (rank, _), snap in sorted(self.snapshots.items()):
            if rank not in worst or total(snap.peak) > total(worst[rank].peak):
                worst[rank] = snap
        return worst

    def render_snapshots(self, width: int) -> Text:
        worst = self.peaks()
        scale = max(max(self.high_water[r], total(s.estimate)) for r, s in worst.items()) or 1
        bar_width = max(10, width - LABEL_WIDTH - NUMBERS_WIDTH)
        out = Text()
        legend = dict.fromkeys(k for s in worst.values() for k, _ in ordered(s.peak))
        for category in legend:
            label, color = style_of(category)
            out.append("■ ", style=color)
            out.append(f"{label}  ")
        out.append("┃ run peak\n", style="bold")
        for rank, s in worst.items():
            peak = total(s.peak)
            out.append(f"rank {rank:<3}", style="bold")
            out.append(bar(s.peak, self.high_water[rank], scale, bar_width))
            out.append(f" peak {format_bytes(peak):>9} ({s.phase})")
            if s.estimate:
                estimate = total(s.estimate)
                off_by = (peak - estimate) / max(estimate, 1)
                out.append(f"  est {format_bytes(estimate):>9}, measured {off_by:+.1%}")
            out.append("\n")
            parts = [f"{style_of(k)[0]} {format_bytes(v)}" for k, v in ordered(s.peak)]
            out.append(" " * LABEL_WIDTH + " · ".join(parts) + f"  (step {s.step})\n", style="dim")
        everything = sum(total(s.peak) for s in worst.values())
        out.append(f"sum of peaks over {len(worst)} rank(s): {format_bytes(everything)}", style="bold")
        return out
