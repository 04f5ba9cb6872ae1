"""One pipeline step as the pipeline pane draws it, from the PipelineTimeline events of its ranks: one row
of columns per pipeline rank across the step's wall-clock, each column saying what the rank was doing
(a compute action, a communication batch, or nothing: the bubble), and the bubble measured beside the one
the schedule's formula gives. Pure data (no Textual): the pane (widgets/pipeline_pane.py) colours it and
the tests read it as text.

Time runs on one clock for every rank: from 0, the earliest step start of the ranks drawn (each event's
`clock_s`, its rows' zero on the wall clock, which the ranks share; every row shifted by its rank's start
after the earliest), to the step's makespan, the latest end of any action of any rank. A recording made
before the events carried their clock (clock_s 0) is drawn as it was: each rank from its own start.

Column c of w holds [c, c + 1) * makespan / w; an action from s to e takes
the columns from round(s / makespan * w) up to round(e / makespan * w), at least one for a compute action,
so that a short one is not lost; a communication batch shorter than a column is not drawn.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

from engine.events import PipelineTimeline

COMPUTE = ("F", "B", "I", "W")  # forward, backward, its input-gradient and weight-gradient halves
COMM = "~"  # a column spent in a communication batch (posting sends, waiting for receives)
IDLE = " "  # a column in which the rank did nothing: the bubble


@dataclass(frozen=True)
class RankRow:
    stage_rank: int  # the rank's place in its pipeline (row order)
    rank: int  # its global rank
    kinds: str  # one character per column: an op of COMPUTE, COMM or IDLE
    labels: str  # one character per column: the micro-batch number inside its block where it fits, else " "
    odd_chunk: str  # one character per column: "1" where a compute action of an odd model chunk is, else " "
    busy_s: float  # time spent computing
    bubble: float  # share of the makespan this rank did not compute


@dataclass(frozen=True)
class StepChart:
    step: int
    schedule: str
    ranks: int  # p, the pipeline's ranks (rows drawn may be fewer while some have not reported)
    micro_batches: int
    chunks: int
    emulated: bool
    makespan_s: float
    rows: list[RankRow]
    measured: float  # the step's bubble: idle compute time over (ranks reported x makespan)


def column(t: float, span: float, width: int) -> int:
    """The column boundary nearest time `t` (halves round up, the same way everywhere)."""
    return math.floor(t / span * width + 0.5) if span > 0 else 0


def on_one_clock(timelines: list[PipelineTimeline]) -> list[PipelineTimeline]:
    """The same timelines with every rank's rows on the clock of the one that started the step first (the
    module's docstring); unchanged when any of them does not know its clock."""
    starts = [t.clock_s for t in timelines]
    if not timelines or not all(starts):
        return list(timelines)
    first = min(starts)
    return [replace(t, actions=[[op, mb, stage, float(a) + t.clock_s - first, float(b) + t.clock_s - first]
                                for op, mb, stage, a, b in t.actions], clock_s=first) for t in timelines]


def makespan(timelines: Iterable[PipelineTimeline]) -> float:
    return max((float(a[4]) for t in timelines for a in t.actions), default=0.0)


def busy_time(timeline: PipelineTimeline) -> float:
    """Seconds `timeline`'s rank spent in compute actions (they run one at a time)."""
    return sum(max(0.0, float(end) - float(start))
               for op, _, _, start, end in timeline.actions if op in COMPUTE)


def measured_bubble(timelines: list[PipelineTimeline]) -> float:
    """A step's bubble: the time its ranks did not compute, over ranks x the step's makespan (one clock)."""
    span = makespan(on_one_clock(timelines))
    return 1 - sum(busy_time(t) for t in timelines) / (len(timelines) * span) if span > 0 else 0.0


def bubble_formula(schedule: str, ranks: int, micro_batches: int, chunks: int) -> tuple[str, float] | None:
    """The bubble the schedule's formula gives as a share of the step (p ranks, m micro-batches, v chunks,
    equal action times), and the formula as text (the schedules' own); None for a schedule it does not
    know (a recording from another release)."""
    from engine.config.vocabulary import PIPELINE_SCHEDULES
    from engine.parallel.pipeline.schedules import formula_bubble
    if schedule not in PIPELINE_SCHEDULES:
        return None
    return formula_bubble(schedule, ranks, micro_batches, chunks)


def rank_row(timeline: PipelineTimeline, span: float, width: int, ranks: int = 1) -> RankRow:
    """One rank's columns; `ranks`: its pipeline's (stage s is model chunk s // ranks, interleaved)."""
    kinds, labels, odd = [IDLE] * width, [" "] * width, [" "] * width
    owner = [-1] * width  # which compute action holds each column (a later one may take a rounded-in column)
    blocks: list[tuple[int, int, str]] = []
    for op, _, _, start, end in timeline.actions:  # communication first: compute is drawn over it
        a, b = min(column(float(start), span, width), width), min(column(float(end), span, width), width)
        if op not in COMPUTE:
            for c in range(a, b):
                kinds[c] = COMM
    for op, micro_batch, stage, start, end in timeline.actions:
        if op not in COMPUTE:
            continue
        a = min(column(float(start), span, width), width - 1)
        b = min(max(a + 1, column(float(end), span, width)), width)
        for c in range(a, b):
            kinds[c], owner[c] = op, len(blocks)
            odd[c] = "1" if int(stage) // max(ranks, 1) % 2 else " "
        blocks.append((a, b, str(micro_batch)))
    for index, (a, b, label) in enumerate(blocks):
        held = [c for c in range(a, b) if owner[c] == index]
        if len(label) <= len(held) and held == list(range(held[0], held[0] + len(held))):
            at = held[0] + (len(held) - len(label)) // 2
            labels[at:at + len(label)] = label
    busy = busy_time(timeline)
    return RankRow(timeline.stage_rank, timeline.rank, "".join(kinds), "".join(labels), "".join(odd), busy,
                   1 - busy / span if span > 0 else 0.0)


def step_chart(timelines: list[PipelineTimeline], width: int, ranks: int) -> StepChart:
    """The chart of one step of a pipeline of `ranks` ranks, `width` columns wide; `timelines`: its ranks'
    events (one each, any order, at least one)."""
    ordered = on_one_clock(sorted(timelines, key=lambda t: t.stage_rank))
    span = makespan(ordered)
    rows = [rank_row(t, span, width, ranks) for t in ordered]
    first = ordered[0]
    return StepChart(first.step, first.schedule, ranks, first.micro_batches, first.chunks,
                     any(t.emulated for t in ordered), span, rows, measured_bubble(ordered))


class StepStore:
    """The latest few steps' timelines, by step and global rank, as ticks bring them: the ranks of a pipeline
    report a step at different moments, so the pane draws the newest step all of a pipeline's ranks have
    reported (or, before there is one, the newest that some have)."""

    KEEP = 4  # steps kept: a rank more steps behind than this is shown at its newest step alone

    def __init__(self) -> None:
        self.steps: dict[int, dict[int, PipelineTimeline]] = {}

    def add(self, timeline: PipelineTimeline) -> None:
        self.steps.setdefault(timeline.step, {})[timeline.rank] = timeline
        for old in sorted(self.steps)[:-self.KEEP]:
            del self.steps[old]

    def latest(self, members: list[int]) -> list[PipelineTimeline]:
        """The timelines of the newest step every rank of `members` reported; failing that, of the newest
        step any of them reported; [] when none has."""
        fallback: list[PipelineTimeline] = []
        for step in sorted(self.steps, reverse=True):
            found = [self.steps[step][r] for r in members if r in self.steps[step]]
            if len(found) == len(members):
                return found
            fallback = fallback or found
        return fallback
