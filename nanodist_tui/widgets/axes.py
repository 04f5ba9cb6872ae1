"""Plot axes that hold still: whole-number step ticks over the run's full length (known from the start), and
value ticks on 1-2-5 steps whose labels all have the same width, so a growing curve never shifts the plot."""

from __future__ import annotations

import math


def nice_step(span: float, max_ticks: int) -> float:
    """The smallest 1, 2 or 5 × 10^k step that cuts `span` into at most `max_ticks` intervals."""
    if span <= 0:
        return 1.0
    raw = span / max(1, max_ticks)
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def step_ticks(first: int, last: int, width: int) -> list[int]:
    """Whole-number ticks from `first` to `last` for a plot `width` cells wide (a label every ~12 cells)."""
    last = max(last, first + 1)
    step = max(1, int(nice_step(last - first, max(2, width // 12))))
    start = -(-first // step) * step
    return list(range(start, last + 1, step))


def value_range(lo: float, hi: float) -> tuple[float, float]:
    """A range that holds [lo, hi] with a little room, so the curve never touches the frame."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return 0.0, 1.0
    if hi - lo < 1e-12:
        pad = abs(hi) * 0.1 or 1.0
        return lo - pad, hi + pad
    pad = (hi - lo) * 0.05
    return lo - pad, hi + pad


def value_ticks(lo: float, hi: float, height: int) -> tuple[list[float], list[str]]:
    """Ticks on 1-2-5 steps between lo and hi, for a plot `height` rows high; labels right-aligned to one
    width, with as many decimals as the step needs."""
    step = nice_step(hi - lo, max(2, height // 3))
    ticks = [k * step for k in range(math.ceil(lo / step), math.floor(hi / step) + 1)]
    decimals = max(0, -math.floor(math.log10(step))) if step < 1 else 0
    labels = [f"{t:.{decimals}f}" for t in ticks]
    width = max((len(label) for label in labels), default=0)
    return ticks, [label.rjust(width) for label in labels]


class GrowingRange:
    """A y-range that only ever widens, so the axis does not jump back and forth as values come and go."""

    def __init__(self) -> None:
        self.lo = math.inf
        self.hi = -math.inf

    def include(self, values) -> None:
        finite = [v for v in values if math.isfinite(v)]
        if finite:
            self.lo, self.hi = min(self.lo, *finite), max(self.hi, *finite)

    def limits(self) -> tuple[float, float]:
        return value_range(self.lo, self.hi)
