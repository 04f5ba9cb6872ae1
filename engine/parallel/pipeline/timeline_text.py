"""A simulated (or measured) pipeline step as plain text: one row per rank across the step's time.

    rank 0 |0>1>2>3>............0<<<4>1<<<5>2<<<6>3<<<7>4<<<..5<<<..6<<<..7<<<|
    rank 1 |..0>1>2>........0<<<3>1<<<4>2<<<5>3<<<6>4<<<7>5<<<..6<<<..7<<<....|

Each compute action is a run of cells from its start to its end, scaled to the width: the micro-batch
(0-9, then a-z, A-Z) in its first cell, then its kind: '>' forward, '<' backward, '-' input-gradient half,
'=' weight-gradient half; '.' is a rank not computing (waiting: the bubble).

When every action lasts a whole number of the shortest one, each such unit gets the same whole number of
cells, so equal actions look equal; otherwise time is scaled to the width. An action shorter than a cell
still takes one, so at small widths the picture rounds; the figures under it are exact.
"""

from __future__ import annotations

import string
import textwrap

from engine.parallel.pipeline.ir import Op
from engine.parallel.pipeline.schedules import formula_bubble
from engine.parallel.pipeline.simulate import Timeline

FILL = {Op.FORWARD: ">", Op.BACKWARD: "<", Op.BACKWARD_INPUT: "-", Op.BACKWARD_WEIGHT: "="}
IDLE = "."
# Micro-batch labels, used again from the 63rd micro-batch on.
SYMBOLS = string.digits + string.ascii_lowercase + string.ascii_uppercase
LEGEND = "each action: its micro-batch, then > F  < B  - I  = W;  . idle"
MIN_CELLS = 10


def label(micro_batch: int) -> str:
    return SYMBOLS[micro_batch % len(SYMBOLS)]


def cells_used(timeline: Timeline, room: int) -> int:
    """How many of `room` cells the makespan takes: a whole number per time unit (the shortest compute
    action) when every action and the makespan are whole units and one cell per unit fits; else all."""
    lengths = [s.end - s.start for spans in timeline.spans for s in spans if s.action.op.is_compute]
    unit = min((d for d in lengths if d > 0), default=0.0)
    if unit <= 0:
        return room
    units = timeline.makespan / unit
    whole = all(abs(x / unit - round(x / unit)) < 1e-9 for x in [*lengths, timeline.makespan])
    if not whole or round(units) > room:
        return room
    return round(units) * (room // round(units))


def row_cells(timeline: Timeline, rank: int, cells: int) -> str:
    """Rank `rank`'s compute actions painted over `cells` cells spanning the makespan."""
    row = [IDLE] * cells
    scale = cells / timeline.makespan if timeline.makespan > 0 else 0.0
    for span in timeline.spans[rank]:
        if not span.action.op.is_compute:
            continue
        first = min(cells - 1, round(span.start * scale))
        end = min(cells, max(first + 1, round(span.end * scale)))
        row[first:end] = [label(span.action.micro_batch)] + [FILL[span.action.op]] * (end - first - 1)
    return "".join(row)


def render(timeline: Timeline, width: int = 100) -> list[str]:
    """The timeline's rows, its time axis and its bubble, every line at most `width` characters."""
    schedule = timeline.schedule
    prefix = [f"rank {r:<{len(str(schedule.ranks - 1))}} |" for r in range(schedule.ranks)]
    room = width - len(prefix[0]) - 1
    if room < MIN_CELLS:
        fits = width - room + MIN_CELLS
        raise ValueError(f"width {width} leaves {room} cells for the timeline; use {fits} or more")
    cells = cells_used(timeline, room)
    lines = [p + row_cells(timeline, r, cells) + "|" for r, p in enumerate(prefix)]
    end = f"{timeline.makespan:g}"
    lines.append(" " * len(prefix[0]) + "0" + end.rjust(cells - 1))  # the time axis
    lines += [short for line in [LEGEND, *bubble_lines(timeline)]
              for short in textwrap.wrap(line, width, subsequent_indent="  ")]
    return [line.rstrip() for line in lines]


def bubble_lines(timeline: Timeline) -> list[str]:
    """The bubble measured on the timeline and the one the schedule's formula gives."""
    s = timeline.schedule
    formula, value = formula_bubble(s.name, s.ranks, s.micro_batches, s.chunks)
    return [f"bubble {timeline.bubble:.1%} simulated (idle compute / ranks x step)",
            f"bubble {value:.1%} by the formula {formula}, p={s.ranks} m={s.micro_batches} v={s.chunks}"]
