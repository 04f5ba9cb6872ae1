"""Every discrete engine event as the one line of text a user reads, worded once: the headless printer,
the workbench log and the loss-scale log all show these lines.

No Textual or rich here: a `Line` is plain text and a level, and each display styles the level its own way.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from engine.events import (
    CheckpointSaved,
    Eval,
    Log,
    LossScaleChange,
    RunFailed,
    RunFinished,
    RunPaused,
    RunStarted,
)
from engine.recorder import is_interruption

# The levels a Line has: "info", "debug", "warning", "error" (a Log event's own levels) and "success".
_LOG_LEVEL_ALIASES = {"warn": "warning"}

_OVERFLOW_WORDS = {"inf": "inf overflow", "nan": "NaN overflow",
                   "hysteresis": "overflow absorbed by hysteresis"}


class Line(NamedTuple):
    text: str
    level: str = "info"


def failure(event: RunFailed) -> str:
    """Which rank failed (when known) and why."""
    who = f"rank {event.rank}: " if event.rank is not None else ""
    return f"{who}{event.message}"


def describe_loss_scale(change: LossScaleChange) -> Line:
    what = _OVERFLOW_WORDS.get(change.reason, change.reason)
    text = f"step {change.step}: {what}, scale {change.old_scale:g} -> {change.new_scale:g}"
    if change.first_param:
        text += f" (first: {change.first_param})"
    return Line(text, "info" if change.reason == "growth" else "warning")


def _loss(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def describe(event: Any) -> Line | None:
    """The line for a discrete event; None for the continuous ones (steps, rank stats, traffic, memory)."""
    if isinstance(event, RunStarted):
        start = f" from step {event.first_step}" if event.first_step else ""
        return Line(f"run {event.run_id} started: preset {event.preset}, {event.n_params:,} parameters, "
                    f"{event.world_size} rank(s), {event.total_steps} steps{start}")
    if isinstance(event, RunPaused):
        what = "paused: every rank holds" if event.paused else "resumed: training goes on"
        return Line(f"step {event.step}: {what}", "warning" if event.paused else "info")
    if isinstance(event, Eval):
        return Line(f"step {event.step}: val loss {event.val_loss:.4f}")
    if isinstance(event, LossScaleChange):
        return describe_loss_scale(event)
    if isinstance(event, CheckpointSaved):
        return Line(f"step {event.step}: checkpoint saved to {event.path}")
    if isinstance(event, Log):
        level = event.level.lower()
        return Line(f"{event.level}: {event.message}", _LOG_LEVEL_ALIASES.get(level, level))
    if isinstance(event, RunFinished):
        folder = f", run folder {event.run_dir}" if event.run_dir else ""
        if event.stopped:
            kept = ", checkpoint kept" if event.run_dir else ""
            return Line(f"stopped at step {event.steps}{kept}: val loss {_loss(event.initial_val_loss)} -> "
                        f"{_loss(event.final_val_loss)}{folder}", "warning")
        return Line(f"finished {event.steps} steps in {event.wall_s:.1f} s: val loss "
                    f"{_loss(event.initial_val_loss)} -> {_loss(event.final_val_loss)}, "
                    f"{event.tokens_per_s:,.0f} tokens/s{folder}", "success")
    if isinstance(event, RunFailed):
        if is_interruption(event.message):  # Ctrl-C or a stop signal is no fault
            return Line(f"run stopped: {failure(event)}", "warning")
        return Line(f"run failed: {failure(event)}", "error")
    return None
