"""Throughput, defined once: tokens (or samples) processed in training steps over the seconds spent in those
steps; evaluations, checkpoints and pauses are not training and are left out.

Every place that shows a run's tokens/s computes it here, from its StepEnd events' `tokens` and
`step_time_s`: the run's summary (summary.json, so `runs`), the compare screen, the workbench header and the
headless summary. The trainer's own figure (RunFinished.tokens_per_s) is the same sum over the same steps.
A mean of per-step rates or their median would weigh a fast step like a slow one and give another number.
"""
from __future__ import annotations

from collections.abc import Iterable


def tokens_per_s(tokens: float, seconds: float) -> float | None:
    """Tokens over seconds; None before any time has been spent in a step."""
    return tokens / seconds if seconds > 0 else None


def of_steps(steps: Iterable) -> float | None:
    """The throughput of these steps (anything with `tokens` and `step_time_s`, e.g. StepEnd events)."""
    tokens = seconds = 0.0
    for step in steps:
        tokens += step.tokens
        seconds += step.step_time_s
    return tokens_per_s(tokens, seconds)
