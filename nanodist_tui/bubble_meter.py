"""A run's measured pipeline bubble, step by step, from the PipelineTimeline events of rank 0's pipeline:
what the headless summary prints beside the formula's, and what `compare` sets two runs' side by side.

A step's bubble is pipeline_chart.measured_bubble of its ranks' timelines (the time they did not compute
over ranks x the step's makespan), taken once every rank of the pipeline has reported the step. The run's
figure is the median over its steps: robust to the first step's warm-up and to a step a busy machine
slowed, as the benchmarks' medians are.

Two figures to hold it against. The formula's assumes equal action times (F = B for GPipe and 1F1B, F = I
= W for ZB-H1), which real compute does not give (a backward costs about two forwards, and its weight half
less than its input half). So the step's own schedule is also played out (engine's simulator) with the
step's own mean time of each compute action per stage and free messages: what the schedule gives with
these stages on an ideal machine. Measured minus simulated is what messages, waits and the machine's
noise added.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from engine.events import PipelineTimeline
from engine.parallel.pipeline.schedules import build_schedule
from engine.parallel.pipeline.simulate import Durations, simulate
from nanodist_tui.pipeline_chart import COMPUTE, bubble_formula, measured_bubble
from nanodist_tui.run_info import RunInfo


def first_pipeline(info: RunInfo) -> list[int]:
    """Rank 0's pipeline group; [] without pipeline parallelism (or with a layout that cannot be)."""
    try:
        return info.mesh.members("pp", 0) if info.pipeline > 1 else []
    except ValueError:
        return []


class BubbleMeter:
    """Feed it a run's RunInfo, then its PipelineTimeline events in any order."""

    def __init__(self, info: RunInfo):
        self.members = set(first_pipeline(info))
        self.pending: dict[int, list[PipelineTimeline]] = {}  # step -> the timelines reported so far
        self.bubbles: list[float] = []  # one per complete step
        self.simulated: list[float] = []  # the same steps played out with their own action times
        self.last: PipelineTimeline | None = None

    def add(self, event: PipelineTimeline) -> None:
        if event.rank not in self.members:
            return
        step = self.pending.setdefault(event.step, [])
        step.append(event)
        if len(step) == len(self.members):
            timelines = self.pending.pop(event.step)
            self.bubbles.append(measured_bubble(timelines))
            if (simulated := simulated_bubble(timelines)) is not None:
                self.simulated.append(simulated)
            self.last = event

    @property
    def median(self) -> float | None:
        return statistics.median(self.bubbles) if self.bubbles else None

    def line(self) -> str | None:
        """"bubble 21.3% measured (median of 10 steps), 20.4% simulated with its action times, 20.0% by
        (p-1)/(m+p-1): 1f1b, 2 ranks, 4 micro-batches"; None before a complete step."""
        if self.last is None or self.median is None:
            return None
        e, p = self.last, len(self.members)
        steps = f"{len(self.bubbles)} step{'s' if len(self.bubbles) != 1 else ''}"
        text = f"bubble {self.median:.1%} measured (median of {steps}"
        text += ", compute emulated)" if e.emulated else ")"
        if self.simulated:
            text += f", {statistics.median(self.simulated):.1%} simulated with its action times"
        if formula := bubble_formula(e.schedule, p, e.micro_batches, e.chunks):
            text += f", {formula[1]:.1%} by {formula[0]}"
        chunks = f", {e.chunks} chunks" if e.chunks > 1 else ""
        return text + f": {e.schedule}, {p} ranks, {e.micro_batches} micro-batches{chunks}"


def simulated_bubble(timelines: list[PipelineTimeline]) -> float | None:
    """The bubble of the step's schedule played out with the step's own mean seconds of each compute
    action on each virtual stage and free messages; None for a schedule or shape this release cannot
    build (a recording from another)."""
    first = timelines[0]
    try:
        schedule = build_schedule(first.schedule, len(timelines), first.micro_batches, first.chunks)
    except (KeyError, ValueError):
        return None
    seconds: defaultdict[tuple[str, int], list[float]] = defaultdict(list)
    for timeline in timelines:
        for op, _, stage, start, end in timeline.actions:
            if op in COMPUTE:
                seconds[op, int(stage)].append(float(end) - float(start))

    def per_stage(op: str) -> tuple[float, ...]:
        return tuple(statistics.fmean(seconds[op, s]) if seconds[op, s] else 0.0
                     for s in range(schedule.stages))
    durations = Durations(forward=per_stage("F"), backward=per_stage("B"), backward_input=per_stage("I"),
                          backward_weight=per_stage("W"))
    return simulate(schedule, durations).bubble
