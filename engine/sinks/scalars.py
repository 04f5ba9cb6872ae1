"""Events -> the named scalars every sink writes, so TensorBoard, W&B and MLflow show the same figures.

    train/loss train/lr train/grad_norm train/tokens_per_s train/step_time_s train/skipped train/loss_scale
                                      StepEnd (loss_scale only when the run scales its loss: fp16)
    val/loss                          Eval
    memory/rank{r}/{category}         bytes rank r held of each category at its own peak over the step's
                                      phases (forward, backward, optimizer), as `nanodist-tui memory` shows
    memory/rank{r}/total              the highest total rank r held at once during the step
    traffic/{src}_to_{dst}            payload bytes sent over the link src -> dst in the step, all phases

Names use only letters, digits, "_" and "/", which every backend accepts (MLflow refuses ">"). Values that
are not finite (the gradient norm of an fp16 step that overflowed) are left out: not every backend stores
NaN or inf, and train/skipped marks the step.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from engine import events as ev


class Point(NamedTuple):
    tag: str
    value: float
    step: int


class ScalarFolder:
    """Stateful: a rank's memory snapshots of one step arrive as one event per phase, and are written as
    one set of figures when that rank's next step begins (or at `flush`)."""

    def __init__(self) -> None:
        self._memory: dict[int, tuple[int, dict[str, int], int]] = {}  # rank -> (step, maxima, top total)

    def fold(self, event: Any) -> list[Point]:
        if isinstance(event, ev.StepEnd):
            values = {"loss": event.loss, "lr": event.lr, "grad_norm": event.grad_norm,
                      "tokens_per_s": event.tokens_per_s, "step_time_s": event.step_time_s,
                      "skipped": float(event.skipped)}
            if event.loss_scale is not None:
                values["loss_scale"] = event.loss_scale
            return _finite([Point(f"train/{k}", v, event.step) for k, v in values.items()])
        if isinstance(event, ev.Eval):
            return _finite([Point("val/loss", event.val_loss, event.step)])
        if isinstance(event, ev.MemorySnapshot):
            return self._memory_snapshot(event)
        if isinstance(event, ev.Traffic):
            per_link: dict[tuple[int, int], float] = {}
            for link in event.links:
                key = (int(link["src"]), int(link["dst"]))
                per_link[key] = per_link.get(key, 0.0) + float(link["bytes"])
            return [Point(f"traffic/{src}_to_{dst}", sent, event.step)
                    for (src, dst), sent in sorted(per_link.items())]
        if isinstance(event, (ev.RunFinished, ev.RunFailed)):
            return self.flush()
        return []

    def flush(self) -> list[Point]:
        """The memory figures still waiting for their rank's next step."""
        points = [p for rank in sorted(self._memory) for p in self._memory_points(rank)]
        self._memory.clear()
        return points

    def _memory_snapshot(self, snap: ev.MemorySnapshot) -> list[Point]:
        points = []
        pending = self._memory.get(snap.rank)
        if pending is not None and pending[0] != snap.step:
            points = self._memory_points(snap.rank)
            pending = None
        step, maxima, top = pending if pending is not None else (snap.step, {}, 0)
        for category, held in snap.peak.items():
            maxima[category] = max(maxima.get(category, 0), int(held))
        self._memory[snap.rank] = (step, maxima, max(top, sum(int(v) for v in snap.peak.values())))
        return points

    def _memory_points(self, rank: int) -> list[Point]:
        step, maxima, top = self._memory.pop(rank)
        prefix = f"memory/rank{rank}/"
        points = [Point(prefix + category, float(held), step) for category, held in maxima.items()]
        return points + [Point(prefix + "total", float(top), step)]


def _finite(points: list[Point]) -> list[Point]:
    return [p for p in points if math.isfinite(p.value)]
