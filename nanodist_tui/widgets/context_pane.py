"""Context parallelism's attention work, rank by rank: the (query chunk, key chunk) blocks and the scores each
rank's ring attention computed in the latest step every rank reported (the ContextWork events, one per rank
per step, live and in a replay: widgets/rank_reports.py), a bar per rank against the busiest, and the busiest
over the mean. The step waits for the busiest rank: under causal attention the contiguous layout's does
2c/(c+1) of the mean, zigzag gives every rank the same blocks."""

from __future__ import annotations

from rich.text import Text

from engine.events import ContextWork
from nanodist_tui.widgets.glyphs import Glyphs
from nanodist_tui.widgets.rank_reports import RankReportsPane


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


class ContextPane(RankReportsPane):
    event_type, title = ContextWork, "context"
    waiting = "no attention work yet: each rank reports it once a step"

    def render_step(self, step: int, reports: list, width: int, glyphs: Glyphs) -> Text:
        return render_work(step, reports, width, glyphs.block, glyphs.track)
