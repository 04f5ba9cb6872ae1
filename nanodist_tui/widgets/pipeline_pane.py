"""The pipeline schedule as it ran: one row per pipeline rank across a step's wall-clock, each compute action
a coloured block from its measured start to its end (forward, backward, or zero-bubble's input- and
weight-gradient halves) with its micro-batch inside where it fits, communication batches a dim line, and the
idle columns blank: the bubbles. Beside each row its idle share, below the step's bubble against the
schedule's formula. With data or tensor parallelism there are several pipelines (the mesh's pp groups): the
pane shows rank 0's first, and the next-pipeline key (app's `next_pipeline`) steps through them.

The chart comes from the PipelineTimeline events the bridge keeps (the latest per rank); it is worked out
only when the pane is drawn, and drawn only when it is on screen."""

from __future__ import annotations

import textwrap

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll

from engine.events import PipelineTimeline
from engine.run.printable import printable
from nanodist_tui.mesh_grid import coords_text, rank_coords
from nanodist_tui.messages import Tick
from nanodist_tui.pipeline_chart import (
    COMM,
    COMPUTE,
    RankRow,
    StepChart,
    StepStore,
    bubble_formula,
    step_chart,
)
from nanodist_tui.run_info import RunInfo
from nanodist_tui.widgets.glyphs import Glyphs, glyphs_of
from nanodist_tui.widgets.text_view import TextView

# op -> (colour, legend); the micro-batch number is written in white over the colour
OPS = {"F": ("#3b6fd4", "forward"), "B": ("#2f9e5a", "backward"), "I": ("#d9822b", "input grad"),
       "W": ("#8e5bd0", "weight grad")}
# interleaved: an odd model chunk's blocks in a darker shade (without colour: the letter in lower case)
DARKER = {"F": "#243f7a", "B": "#1c5e36", "I": "#8a5219", "W": "#573780"}
IDLE_COLUMN = 7  # " 27.3%" after each row: its idle share


class PipelinePane(VerticalScroll):
    def __init__(self, info: RunInfo, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = "pipeline"
        self.info = info
        self.pipelines: list[list[int]] = []  # each pipeline's global ranks, by stage rank; rank 0's first
        self.names: list[str] = []  # each pipeline's coordinates off the pipeline axis: "dp1 tp0"
        self.problem = ""
        try:
            mesh = info.mesh
            self.pipelines = mesh.groups("pp")
            self.names = [coords_text({a: c for a, c in rank_coords(mesh, g[0]).items() if a != "pp"})
                          for g in self.pipelines]
        except ValueError as err:  # only a damaged recording: a run's layout was checked before it started
            self.problem = str(err)
        self.shown = 0  # which pipeline is drawn
        self.store = StepStore()
        self.seen: dict[int, PipelineTimeline] = {}  # each rank's latest, as the ticks carried it
        self.view = TextView("", classes="pipeline-text")
        self._dirty = True

    def compose(self) -> ComposeResult:
        yield self.view

    def ingest(self, tick: Tick) -> None:
        for rank, event in tick.pipeline.items():
            if self.seen.get(rank) is not event:  # a tick carries every rank's latest, new or not
                self.seen[rank] = event
                self.store.add(event)
                self._dirty = True

    def next_pipeline(self) -> None:
        if len(self.pipelines) > 1:
            self.shown = (self.shown + 1) % len(self.pipelines)
            self._dirty = True
            self.redraw()

    def on_resize(self) -> None:
        self._dirty = True  # the chart is fitted to the width

    def redraw(self) -> None:
        if not (self._dirty and self.is_on_screen):
            return
        self._dirty = False
        # the scrollbar's column kept free from the start, as the mesh pane does
        width = (self.content_region.width or 80) - self.styles.scrollbar_size_vertical
        self.view.show(self.render_pipeline(width, glyphs_of(self), self.next_key()))

    def next_key(self) -> str:
        keymap = getattr(self.app, "_keymap", {})
        return str(keymap.get("next-pipeline", "g"))

    def render_pipeline(self, width: int, glyphs: Glyphs, key: str = "g") -> Text:
        if self.info.pipeline <= 1:
            return Text("no pipeline in this run: parallel.pipeline is 1", style="dim")
        if not self.pipelines:
            return Text(wrapped(printable(f"no pipeline to draw: {self.problem}"), width), style="yellow")
        members = self.pipelines[self.shown]
        out = Text()
        timelines = self.store.latest(members)
        if not timelines:
            out.append(self._which(width, key))
            out.append("no timeline yet: each pipeline rank reports its actions once per step", style="dim")
            return out
        global_ranks = members != list(range(len(members)))  # a rank differs from its stage rank: say both
        label = max(len(row_label(s, r, global_ranks)) for s, r in enumerate(members)) + 1
        chart = step_chart(timelines, max(10, width - label - IDLE_COLUMN), len(members))
        out.append(wrapped(title(chart), width) + "\n", style="bold")
        out.append(self._which(width, key))
        out.append(" " * (label + len(chart.rows[0].kinds)) + " idle".rjust(IDLE_COLUMN) + "\n", style="dim")
        reported = {row.stage_rank: row for row in chart.rows}
        for stage_rank, rank in enumerate(members):
            out.append(row_label(stage_rank, rank, global_ranks).ljust(label), style="bold")
            row = reported.get(stage_rank)
            if row is None:
                out.append("no report for this step yet\n", style="dim")
                continue
            out.append_text(blocks(row, glyphs))
            out.append(f"{row.bubble:7.1%}\n")
        out.append(" " * label + ruler(chart.makespan_s, len(chart.rows[0].kinds)) + "\n", style="dim")
        out.append(wrapped(bubble_line(chart), width) + "\n")
        out.append_text(legend({k for row in chart.rows for k in row.kinds}, glyphs, width, chart.chunks > 1))
        return out

    def _which(self, width: int, key: str) -> str:
        """Which pipeline is shown, where there are several."""
        if len(self.pipelines) < 2:
            return ""
        members, name = self.pipelines[self.shown], self.names[self.shown]
        whose = " (rank 0's)" if self.shown == 0 else ""
        line = (f"pipeline {self.shown + 1} of {len(self.pipelines)}{whose}: {name}, ranks "
                f"{' '.join(map(str, members))}; {key}: next pipeline")
        return wrapped(line, width) + "\n"


def row_label(stage_rank: int, rank: int, global_rank: bool) -> str:
    return f"pp{stage_rank}" + (f" r{rank}" if global_rank else "")


def title(chart: StepChart) -> str:
    shape = f"{chart.ranks} ranks x {chart.micro_batches} micro-batches"
    if chart.chunks > 1:
        shape += f" x {chart.chunks} chunks"
    parts = [f"step {chart.step}", printable(chart.schedule), shape] + (["emulated compute"] if chart.emulated
                                                                       else [])
    return " · ".join(parts)


def bubble_line(chart: StepChart) -> str:
    measured = f"bubble {chart.measured:.1%} measured"
    formula = bubble_formula(chart.schedule, chart.ranks, chart.micro_batches, chart.chunks)
    if formula is None:
        return f"{measured} (no formula for this schedule)"
    text, value = formula
    shape = f"p {chart.ranks}, m {chart.micro_batches}" + (f", v {chart.chunks}" if "v" in text else "")
    return f"{measured}, {value:.1%} by the formula {text} ({shape}; equal action times)"


def ruler(seconds: float, width: int) -> str:
    end = f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"
    return "0" + end.rjust(width - 1)


def blocks(row: RankRow, glyphs: Glyphs) -> Text:
    text = Text()
    for kind, label, odd in zip(row.kinds, row.labels, row.odd_chunk, strict=True):
        if kind in COMPUTE:
            fill = (kind.lower() if odd == "1" else kind) if glyphs.letters else " "
            colour = DARKER[kind] if odd == "1" else OPS[kind][0]
            text.append(label if label != " " else fill, style=f"bold white on {colour}")
        elif kind == COMM:
            text.append(glyphs.line, style="dim")
        else:
            text.append(" ")
    return text


def legend(kinds: set[str], glyphs: Glyphs, width: int, chunks: bool = False) -> Text:
    """The ops the chart shows, the communication line and the blank, folded to `width`; with model chunks,
    how an odd chunk's blocks differ."""
    entries = [(f" {op} ", f"bold white on {colour}", what)
               for op, (colour, what) in OPS.items() if op in kinds]
    if chunks:
        odd = " f " if glyphs.letters else "   "
        entries.append((odd, f"bold white on {DARKER['F']}", "odd model chunk"))
    entries += [(glyphs.line * 2, "dim", "send/recv, waiting"), ("  ", "", "idle: the bubble")]
    out, used = Text(), 0
    for swatch, style, what in entries:
        size = len(swatch) + 1 + len(what)
        if used and used + 2 + size > width:
            out.append("\n")
            used = 0
        elif used:
            out.append("  ")
            used += 2
        out.append(swatch, style=style)
        out.append(f" {what}")
        used += size
    return out


def wrapped(line: str, width: int) -> str:
    """A line folded to `width`, continuation lines indented: nothing is cut off."""
    folded = textwrap.wrap(line, max(width, 12), subsequent_indent="  ", break_on_hyphens=False)
    return "\n".join(folded) or line
