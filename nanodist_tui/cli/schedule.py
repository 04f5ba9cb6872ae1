"""`nanodist-tui schedule --pp P --micro-batches M --schedule S [--chunks V] [--width W] [--json]`: one
pipeline step of a schedule (engine.parallel.pipeline.schedules), checked, simulated and drawn as a text
timeline with its bubble beside the formula's, its peak in-flight micro-batches per rank and its messages.

Times are in units of a forward: F = 1, B = 2, and a zero-bubble backward split into I = 1 and W = 1, so
every schedule does the same work (interleaved's actions each cover one of v chunks: F = 1/v, B = 2/v).
The published bubble formulas hold at these times: GPipe's, 1F1B's and interleaved's for any ratio of F
to B, ZB-H1's for F = I = W. Messages take no time here."""

from __future__ import annotations

import json
import textwrap
from typing import Annotated

import typer

from engine.config.vocabulary import PIPELINE_SCHEDULES
from nanodist_tui.cli.errors import UsageError, user_errors
from nanodist_tui.cli.options import JsonOpt

MAX_PAIRS = 100_000  # (micro-batch, stage) pairs a drawing may take: beyond, it is too slow and unreadable
MIN_WIDTH = 40
FLAGS = {"ranks": "--pp", "micro_batches": "--micro-batches", "chunks": "--chunks"}  # ShapeError.parameter

PpOpt = Annotated[int, typer.Option("--pp", help="pipeline ranks (stages, one per rank; v per rank "
                                                  "interleaved)", show_default=False)]
MicroOpt = Annotated[int, typer.Option("--micro-batches", "-m", help="micro-batches per step",
                                       show_default=False)]
ScheduleOpt = Annotated[str, typer.Option("--schedule", help=" | ".join(PIPELINE_SCHEDULES))]
ChunksOpt = Annotated[int | None, typer.Option(
    "--chunks", help="model chunks per rank, interleaved only (default 2)", show_default=False)]
WidthOpt = Annotated[int, typer.Option("--width", help="columns of the drawing")]


def schedule(pp: PpOpt, micro_batches: MicroOpt, name: ScheduleOpt = "1f1b", chunks: ChunksOpt = None,
             width: WidthOpt = 100, as_json: JsonOpt = False) -> None:
    """A pipeline schedule drawn as a text timeline, with its bubble against the formula's."""
    from engine.parallel.pipeline.check import validate
    from engine.parallel.pipeline.schedules import ShapeError, build_schedule
    from engine.parallel.pipeline.simulate import simulate
    with user_errors():
        v = shape_errors(pp, micro_batches, name, chunks, width)
        try:
            sched = build_schedule(name, pp, micro_batches, v)
        except ShapeError as e:
            raise UsageError(f"{FLAGS[e.parameter]} {e.value} with --schedule {name}: {e.reason}") from None
    validate(sched)  # a schedule we generate is valid: failing here is a bug, not a user's mistake
    timeline = simulate(sched, reference_durations(v))
    report = describe(timeline)
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        print("\n".join(text(timeline, report, width)))


def shape_errors(pp: int, micro_batches: int, name: str, chunks: int | None, width: int) -> int:
    """The chunks to use; a UsageError naming the flag for anything the schedules cannot take."""
    if name not in PIPELINE_SCHEDULES:
        raise UsageError(f"--schedule {name}: unknown schedule; use one of {', '.join(PIPELINE_SCHEDULES)}")
    if pp < 1:
        raise UsageError(f"--pp {pp}: a pipeline needs at least 1 rank; use --pp 1 or more")
    if micro_batches < 1:
        raise UsageError(f"--micro-batches {micro_batches}: a step needs at least 1; use 1 or more")
    if chunks is not None and name != "interleaved" and chunks != 1:
        raise UsageError(f"--chunks {chunks}: only the interleaved schedule has several model chunks per "
                         "rank; drop --chunks, or use --schedule interleaved")
    v = (2 if name == "interleaved" else 1) if chunks is None else chunks
    if v < 1:
        raise UsageError(f"--chunks {v}: a rank holds at least 1 chunk; use 2 or more with interleaved")
    if pp * v * micro_batches > MAX_PAIRS:
        raise UsageError(f"--pp {pp} x --chunks {v} x --micro-batches {micro_batches}: "
                         f"{pp * v * micro_batches} (stage, micro-batch) pairs, more than the {MAX_PAIRS} "
                         "this command draws; use fewer")
    if width < MIN_WIDTH:
        raise UsageError(f"--width {width}: too narrow to draw; use {MIN_WIDTH} or more")
    return v


def reference_durations(chunks: int):
    """F = 1, B = 2 = I + W per micro-batch and rank; each of v chunks does 1/v of a rank's work."""
    from engine.parallel.pipeline.simulate import Durations
    return Durations(forward=1.0 / chunks, backward=2.0 / chunks, backward_input=1.0 / chunks,
                     backward_weight=1.0 / chunks)


def describe(timeline) -> dict:
    """The step as data: shape, bubble against the formula, peaks in flight, messages, every action."""
    from engine.parallel.pipeline import counts
    from engine.parallel.pipeline.schedules import formula_bubble
    s = timeline.schedule
    formula, value = formula_bubble(s.name, s.ranks, s.micro_batches, s.chunks)
    d = timeline.durations
    return {
        "schedule": s.name, "pp": s.ranks, "micro_batches": s.micro_batches, "chunks": s.chunks,
        "durations": {"F": d.forward, "B": d.backward, "I": d.backward_input, "W": d.backward_weight,
                      "p2p": d.p2p},
        "makespan": timeline.makespan, "bubble": timeline.bubble,
        "formula": {"text": formula, "bubble": value},
        "peak_in_flight": list(counts.peak_in_flight(s)),
        "peak_held_until_w": list(counts.peak_held(s)),
        "messages": counts.messages(s),
        "actions": [[span_json(sp) for sp in spans] for spans in timeline.spans],
    }


def span_json(span) -> dict:
    a = span.action
    return {"action": str(a), "op": a.op.value, "micro_batch": a.micro_batch, "stage": a.stage,
            "peer": a.peer, "start": span.start, "end": span.end}


def text(timeline, report: dict, width: int) -> list[str]:
    """The drawing and its figures, no line wider than `width`."""
    from engine.parallel.pipeline.timeline_text import render
    from nanodist_tui.cli.mesh import packed
    s = timeline.schedule
    chunk = f", {s.chunks} chunks per rank" if s.chunks > 1 else ""
    lines = [f"{s.name}: {s.ranks} pipeline ranks, {s.micro_batches} micro-batches{chunk}",
             "times in forwards: F = 1, B = 2 = I + W" + (f", each chunk 1/{s.chunks} of that" if s.chunks > 1
                                                           else ""), ""]
    lines += render(timeline, width)
    unit = "(micro-batch, chunk) pairs" if s.chunks > 1 else "micro-batches"
    flight = [f"peak in flight per rank ({unit} whose activations are held):",
              *packed([f"r{r} {n}" for r, n in enumerate(report["peak_in_flight"])], width, "  ")]
    if report["peak_held_until_w"] != report["peak_in_flight"]:
        flight += [f"peak held until W per rank ({unit} begun whose W has not run):",
                   *packed([f"r{r} {n}" for r, n in enumerate(report["peak_held_until_w"])], width, "  ")]
    msgs = report["messages"]
    lines += flight + [f"messages: {msgs['activation']} activations forward, {msgs['gradient']} gradients "
                       "backward"]
    return [wrapped for line in lines for wrapped in (textwrap.wrap(line, width, subsequent_indent="  ")
                                                      if len(line) > width else [line])]
