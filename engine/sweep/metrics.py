"""A trial's metrics (engine.config.vocabulary.METRICS), folded from the events of its training run.

The tracker is an event subscriber: it sees what the recorder sees, so a trial's scores are exactly what
its run folder shows. `value(name)` is the metric so far, which is what a pruner is shown at each
evaluation; at the end of the run it is the trial's score.
"""
from __future__ import annotations

import math
from collections import deque

from engine import events as ev

MB = 1e6  # the project's unit: 10^6 bytes
TRAIN_LOSS_WINDOW = 10  # steps averaged for the "loss" metric


class MetricTracker:
    def __init__(self) -> None:
        self.val_losses: list[float] = []
        self.recent_losses: deque[float] = deque(maxlen=TRAIN_LOSS_WINDOW)
        self.steps = 0
        self.tokens = 0
        self.train_s = 0.0
        self.peak_bytes: dict[int, int] = {}  # rank -> highest simultaneous total of any phase
        self.bytes_sent: dict[int, list[int]] = {}  # rank -> [sum over steps, steps]
        self.diverged: str | None = None  # why, once a loss is not finite

    def __call__(self, event) -> None:
        event = ev.as_event(event)
        if isinstance(event, ev.StepEnd):
            self._step(event)
        elif isinstance(event, ev.Eval):
            self.val_losses.append(event.val_loss)
            if not math.isfinite(event.val_loss) and self.diverged is None:
                self.diverged = f"diverged: val loss {event.val_loss} at step {event.step}"
        elif isinstance(event, ev.MemorySnapshot):
            total = sum(event.peak.values())
            self.peak_bytes[event.rank] = max(self.peak_bytes.get(event.rank, 0), total)
        elif isinstance(event, ev.RankStats):
            sums = self.bytes_sent.setdefault(event.rank, [0, 0])
            sums[0] += event.bytes_sent
            sums[1] += 1

    def _step(self, e: ev.StepEnd) -> None:
        self.steps = e.step
        if e.skipped:  # an fp16 overflow: the step changed nothing and its loss is no score
            return
        self.tokens += e.tokens
        self.train_s += e.step_time_s
        self.recent_losses.append(e.loss)
        if not math.isfinite(e.loss) and self.diverged is None:
            self.diverged = f"diverged: loss {e.loss} at step {e.step}"

    @property
    def peak_memory_mb(self) -> float | None:
        return max(self.peak_bytes.values()) / MB if self.peak_bytes else None

    def value(self, name: str) -> float | None:
        """The metric so far; None while the run has not produced it yet."""
        if name == "val_loss":
            return self.val_losses[-1] if self.val_losses else None
        if name == "best_val_loss":
            return min(self.val_losses) if self.val_losses else None
        if name == "loss":
            return sum(self.recent_losses) / len(self.recent_losses) if self.recent_losses else None
        if name == "tokens_per_s":
            return self.tokens / self.train_s if self.train_s > 0 else None
        if name == "peak_memory_mb":
            return self.peak_memory_mb
        if name == "bytes_per_step":
            means = [total / steps for total, steps in self.bytes_sent.values() if steps]
            return max(means) if means else None
        raise KeyError(name)
