"""Two recorded runs side by side: the figures the compare screen shows, read from their events alone (no
Textual): loss curves, each rank's memory peak by category, traffic per phase, throughput, and for pipeline
parallelism the bubble of rank 0's pipeline."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from engine.events import (
    Eval,
    History,
    MemorySnapshot,
    PipelineTimeline,
    RunFinished,
    RunStarted,
    StepEnd,
    Traffic,
)
from engine.run import throughput
from engine.run.recorder import read_events
from nanodist_tui.bubble_meter import BubbleMeter
from nanodist_tui.run_info import RunInfo
from nanodist_tui.traffic import phase_bandwidths, rank_traffic


@dataclass
class RunFigures:
    name: str
    info: RunInfo
    train: list[tuple[int, float]] = field(default_factory=list)
    val: list[tuple[int, float]] = field(default_factory=list)
    memory: dict[str, int] = field(default_factory=dict)  # category -> highest peak over ranks and steps
    memory_total: int = 0  # highest simultaneous total of any rank
    phase_bytes: dict[str, int] = field(default_factory=dict)  # phase -> bytes rank 0 sent per step (last)
    phase_busbw: dict[str, float] = field(default_factory=dict)  # phase -> median busbw over steps, rank 0
    tokens_per_s: float | None = None  # over all its steps (engine.run.throughput, as `runs` shows it)
    final_val: float | None = None
    steps: int = 0
    bubble: float | None = None  # median over steps of rank 0's pipeline's measured bubble; None: no pipeline


def read_run(run_dir: Path) -> RunFigures:
    return figures(read_events(run_dir), Path(run_dir).name)


def figures(events: list, name: str) -> RunFigures:
    started = next((e for e in events if isinstance(e, RunStarted)), None)
    info = RunInfo.from_started(started) if started is not None else RunInfo(preset=name)
    out = RunFigures(name, info)
    steps: list[StepEnd] = []
    busbw: dict[str, list[float]] = {}
    bubbles = BubbleMeter(info)
    for e in events:
        if isinstance(e, History):  # a resumed run: its lineage's curves first (engine.run.lineage)
            out.train += [(step, loss) for step, loss, *_ in e.steps if math.isfinite(loss)]
            out.val += [(step, val_loss) for step, val_loss in e.evals]
        elif isinstance(e, StepEnd):
            out.steps = e.step
            if not e.skipped and math.isfinite(e.loss):
                out.train.append((e.step, e.loss))
            steps.append(e)
        elif isinstance(e, Eval) and not (out.val and out.val[-1][0] == e.step):  # a resume's first repeats
            out.val.append((e.step, e.val_loss))
            out.final_val = e.val_loss
        elif isinstance(e, MemorySnapshot):
            for category, amount in e.peak.items():
                out.memory[category] = max(out.memory.get(category, 0), amount)
            out.memory_total = max(out.memory_total, sum(e.peak.values()))
        elif isinstance(e, Traffic) and e.rank == 0:
            traffic = rank_traffic(e)
            out.phase_bytes = {phase: b for phase, (b, _) in traffic.phases.items()}
            for row in phase_bandwidths(traffic, info.world_size):
                if math.isfinite(row.busbw):
                    busbw.setdefault(row.phase, []).append(row.busbw)
        elif isinstance(e, PipelineTimeline):
            bubbles.add(e)
        elif isinstance(e, RunFinished):
            out.steps = e.steps
    out.phase_busbw = {phase: statistics.median(values) for phase, values in busbw.items()}
    out.tokens_per_s = throughput.of_steps(steps)
    out.bubble = bubbles.median
    return out


def smooth(points: list[tuple[int, float]], weight: float) -> list[tuple[int, float]]:
    """An exponential moving average (TensorBoard's smoothing): weight 0 leaves the curve as it is."""
    out, value = [], None
    for x, y in points:
        value = y if value is None else weight * value + (1 - weight) * y
        out.append((x, value))
    return out
