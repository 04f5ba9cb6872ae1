"""Context parallelism's attention work, rank by rank: the (query chunk, key chunk) blocks and the scores each
rank's ring attention computed in the latest step every rank reported (the ContextWork events, one per rank
per step, live and in a replay), a bar per rank against the busiest, and the busiest over the mean. The step
waits for the busiest rank: under causal attention the contiguous layout's does 2c/(c+1) of the mean, zigzag
gives every rank the same blocks.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll

from engine.events import ContextWork
from nanodist_tui.messages import Tick
from nanodist_tui.run_info import RunInfo
from nanodist_tui.widgets.glyphs import glyphs_of
from nanodist_tui.widgets.text_view import TextView

KEPT_STEPS = 3  # steps whose reports are kept while the slower ranks catch up


def render_work(step: int, reports: list[ContextWork], width: int, block: str, track: str) -> Text:
    """The pane's text for one step's reports (one per rank)."""
    reports = sorted(reports, key=lambda e: e.rank)
    c, layout = reports[0].degree, reports[0].layout
    out = Text(f"step {step}: ring attention, {layout} layout, {c} ranks per context-parallel group\n\n",
               style="bold")
    out.append(f"{'rank':>4}  {'blocks':>6}  {'scores':>11}  work (scores, against the busiest rank)\n",
               style="dim")
    top = max(e.scores for e in reports) or 1
    bar = max(10, width - 36)
    for e in reports:
        filled = round(bar * e.scores / top)
        out.append(f"{e.rank:>4}  {e.blocks:>6}  {e.scores:>11,}  ")
        out.append(block * filled, style="#3b6fd4")
        out.append(track * (bar - filled) + "\n", style="dim")
    blocks, scores = [e.blocks for e in reports], [e.scores for e in reports]
    out.append(f"\nbusiest / mean: blocks {max(blocks) * len(blocks) / sum(blocks):.2f}, "
               f"scores {max(scores) * len(scores) / sum(scores):.2f}\n")
    out.append(f"causal attention's blocks: contiguous 2c/(c+1) = {2 * c / (c + 1):.2f}, zigzag 1.00\n",
               style="dim")
    return out


class ContextPane(VerticalScroll):
    def __init__(self, info: RunInfo, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = "context"
        self.info = info
        self.steps: dict[int, dict[int, ContextWork]] = {}  # step -> rank -> its report
        self.view = TextView("", classes="context-text")
        self._dirty = True

    def compose(self) -> ComposeResult:
        yield self.view

    def ingest(self, tick: Tick) -> None:
        for event in tick.events:
            if isinstance(event, ContextWork):
                self.steps.setdefault(event.step, {})[event.rank] = event
                self._dirty = True
        for old in sorted(self.steps)[:-KEPT_STEPS]:
            del self.steps[old]

    def on_resize(self) -> None:
        self._dirty = True

    def redraw(self) -> None:
        if not (self._dirty and self.is_on_screen):
            return
        self._dirty = False
        if not self.steps:
            self.view.show(Text("no attention work yet: each rank reports it once a step", style="dim"))
            return
        whole = [s for s, ranks in self.steps.items() if len(ranks) == self.info.world_size]
        step = max(whole) if whole else max(self.steps)
        glyphs = glyphs_of(self)
        width = (self.content_region.width or 80) - self.styles.scrollbar_size_vertical
        self.view.show(render_work(step, list(self.steps[step].values()), width, glyphs.block, glyphs.track))
