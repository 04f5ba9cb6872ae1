"""Per-rank memory: the categories at the step's peak as one stacked bar per rank, the run's high-water mark
on it, and the estimator's figure beside the measurement (MB = 10^6 bytes, as `nanodist-tui memory`).
Under pipeline parallelism each row names its rank's stages and holds it against that rank's own estimate,
so the stages' imbalance shows."""

from __future__ import annotations

from rich.text import Text

from engine.events import MemorySnapshot
from engine.memory.ledger import CATEGORIES, peak_phase
from engine.parallel.mesh import Mesh
from engine.run.printable import printable
from nanodist_tui.messages import Tick
from nanodist_tui.run_info import RunInfo
from nanodist_tui.widgets.glyphs import Glyphs, glyphs_of
from nanodist_tui.widgets.text_view import TextView
from nanodist_tui.widgets.units import format_bytes

# Label, colour and (without colour) fill letter per ledger category; colours follow PyTorch's memory
# timeline (parameters green, gradients blue, optimizer state golds, activations red, temporaries purple).
STYLES = {
    "parameters": ("params", "#2e8b2e", "p"),
    "gradients": ("grads", "#3050e0", "g"),
    "master": ("fp32 master", "#daa520", "M"),
    "adam_m": ("adam m", "#b8860b", "m"),
    "adam_v": ("adam v", "#f0c040", "v"),
    "activations": ("activations", "#e03030", "a"),
    "comm_buffers": ("comm buffers", "#20b2aa", "c"),
    "temporaries": ("temporaries", "#9370db", "t"),
}
OTHER = ("#808080", "o")
LABEL_WIDTH = 8  # "rank 12 "
NUMBERS_WIDTH = 42  # "  221.5 kB backward   est  218.5 kB  +1.4%"
MIN_BAR = 10


def style_of(category: str) -> tuple[str, str, str]:
    """(label, colour, letter); a category the ledger adds later keeps its own name and a grey."""
    return STYLES.get(category, (printable(category), *OTHER))  # a recorded run's: shown escaped


def ordered(amounts: dict[str, int]) -> list[tuple[str, int]]:
    """Non-zero categories in the ledger's order, then any others by name."""

    def position(item: tuple[str, int]) -> tuple[int, str]:
        return (CATEGORIES.index(item[0]) if item[0] in CATEGORIES else len(CATEGORIES), item[0])

    return sorted(((k, v) for k, v in amounts.items() if v), key=position)


def total(amounts: dict[str, int] | None) -> int:
    return sum(amounts.values()) if amounts else 0


def bar(amounts: dict[str, int], mark: int, scale: int, width: int, glyphs: Glyphs) -> Text:
    """`amounts` stacked in a bar `width` cells wide that `scale` bytes fill; the mark at `mark` bytes."""
    text = Text()
    filled = running = 0
    for category, amount in ordered(amounts):
        running += amount
        end = round(running / scale * width)  # cumulative rounding: segments do not drift
        _, color, letter = style_of(category)
        text.append(glyphs.fill(letter) * (end - filled), style=color)
        filled = end
    # The mark is the highest peak so far, never below this bar, so it sits past the filled part.
    mark_at = max(filled, min(width - 1, round(mark / scale * width)))
    text.append(glyphs.track * (mark_at - filled), style="dim")
    if mark_at < width:
        text.append(glyphs.mark, style="bold")
        text.append(glyphs.track * (width - mark_at - 1), style="dim")
    return text


def _wrap(parts: list[str], width: int, sep: str = " · ") -> list[str]:
    """Parts joined by `sep` into lines of at most `width` characters (a part is never split)."""
    lines = [""]
    for part in parts:
        candidate = f"{lines[-1]}{sep}{part}" if lines[-1] else part
        if len(candidate) > width and lines[-1]:
            lines.append(part)
        else:
            lines[-1] = candidate
    return lines


class MemoryPane(TextView):
    """Keeps the latest snapshot per (rank, phase); redrawn by the app's render timer."""
    FIXED_SIZE = True  # a share of its row: lines that come and go need no layout until it overflows

    def __init__(self, info: RunInfo, *, id: str | None = None) -> None:
        super().__init__("no memory snapshot yet", id=id, classes="placeholder")
        self.border_title = "memory per rank"
        self.info = info
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
        self.show(self.render_snapshots(self.content_region.width or 80))

    def peaks(self) -> dict[int, MemorySnapshot]:
        """Per rank, the snapshot of the phase whose peak was highest (engine.memory.ledger.peak_phase: on a
        tie the later phase, as the estimator and `memory --measure` take it)."""
        by_rank: dict[int, dict[str, MemorySnapshot]] = {}
        for (rank, phase), snap in self.snapshots.items():
            by_rank.setdefault(rank, {})[phase] = snap
        worst: dict[int, MemorySnapshot] = {}
        for rank in sorted(by_rank):
            top = peak_phase({p: snap.peak for p, snap in by_rank[rank].items()})
            if top is not None:
                worst[rank] = by_rank[rank][top]
        return worst

    def estimate_of(self, snap: MemorySnapshot) -> dict[str, int] | None:
        """The estimator's categories for the snapshot's phase: the run's, made once from the config, so they
        come with RunStarted rather than with each snapshot; every rank's the same, but under pipeline
        parallelism, where each rank has its own (its stages')."""
        per_rank = self.info.memory_estimate_per_rank
        if per_rank and 0 <= snap.rank < len(per_rank):
            return per_rank[snap.rank].get(snap.phase)
        return (self.info.memory_estimate or {}).get(snap.phase)

    def stage_of(self, rank: int) -> str:
        """Under pipeline parallelism, the stages `rank` holds, out of how many ("stage 1/4", "stages 1,5/8"),
        so the stages' imbalance reads off the rows; "" without a pipeline."""
        info = self.info
        if info.pipeline <= 1:
            return ""
        try:
            pp = Mesh(info.world_size, info.tensor, info.pipeline, info.context, info.expert,
                      info.order).coords(rank).pp
        except ValueError:  # a layout the mesh refuses (a hand-made RunStarted): name nothing
            return ""
        stages = list(range(pp, info.pipeline * info.chunks, info.pipeline))
        return f"stage{'s' * (len(stages) > 1)} {','.join(map(str, stages))}/{info.pipeline * info.chunks}"

    def render_snapshots(self, width: int) -> Text:
        glyphs = glyphs_of(self)
        worst = self.peaks()
        scale = max(max(self.high_water[r], total(self.estimate_of(s))) for r, s in worst.items()) or 1
        bar_width = max(MIN_BAR, width - LABEL_WIDTH - NUMBERS_WIDTH)
        out = Text()
        legend = dict.fromkeys(k for s in worst.values() for k, _ in ordered(s.peak))
        used = 0
        for category in [*legend, None]:
            label, color, letter = style_of(category) if category else ("run peak", "bold", glyphs.mark)
            if used and used + len(label) + 4 > width:
                out.append("\n")
                used = 0
            out.append((letter if category is None else glyphs.fill(letter)) + " ", style=color)
            out.append(f"{label}  ", style="bold" if category is None else "")
            used += len(label) + 4
        out.append("\n")
        for rank, s in worst.items():
            peak = total(s.peak)
            out.append(f"rank {rank:<3}", style="bold")
            out.append(bar(s.peak, self.high_water[rank], scale, bar_width, glyphs))
            out.append(f" {format_bytes(peak, 9)} {s.phase:<9}")
            if predicted := self.estimate_of(s):
                estimate = total(predicted)
                out.append(f" est {format_bytes(estimate, 9)} {(peak - estimate) / max(estimate, 1):+6.1%}")
            out.append("\n")
            parts = [f"{style_of(k)[0]} {format_bytes(v)}" for k, v in ordered(s.peak)] + [f"(step {s.step})"]
            parts = [stage] + parts if (stage := self.stage_of(rank)) else parts
            for line in _wrap(parts, width - LABEL_WIDTH):
                out.append(" " * LABEL_WIDTH + line + "\n", style="dim")
        everything = sum(total(s.peak) for s in worst.values())
        out.append(f"sum of peaks over {len(worst)} rank(s): {format_bytes(everything)}", style="bold")
        missing = sorted(set(range(self.info.world_size)) - set(worst))
        if missing:
            out.append(f"\nno memory reported by rank(s) {', '.join(map(str, missing))}", style="yellow")
        return out
