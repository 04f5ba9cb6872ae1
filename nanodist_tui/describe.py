"""Every discrete engine event as the one line of text a user reads, worded once: the headless printer,
the workbench log and the loss-scale log all show these lines.

No Textual or rich here: a `Line` is plain text and a level, and each display styles the level its own way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple, overload

from engine.events import (
    CheckpointSaved,
    Eval,
    History,
    Log,
    LossScaleChange,
    RunFailed,
    RunFinished,
    RunPaused,
    RunStarted,
    SweepFinished,
    SweepStarted,
    TrialFinished,
    TrialReport,
    TrialStarted,
)
from engine.run.summary import is_interruption


def threads_note(event: RunStarted) -> str:
    """ " × 2 threads": each rank's BLAS/OpenMP threads, when the run reported them."""
    return f" × {event.threads_per_rank} thread(s)" if event.threads_per_rank else ""


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


_TRIAL_LEVELS = {"complete": "success", "pruned": "info", "rejected": "warning", "failed": "warning"}


def number(value) -> str:
    """A sampled value or a score, short: 4 significant digits for floats."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def params_text(params: dict) -> str:
    return " ".join(f"{key}={number(value)}" for key, value in params.items())


def scores_text(metrics: list, values: list | None) -> str:
    return ", ".join(f"{m} {number(v)}" for m, v in zip(metrics, values or []))


def best_text(best: list | None, metrics: list, best_values: list | None) -> str:
    if not best:
        return "no trial complete yet"
    if len(metrics) > 1:
        return f"Pareto front: trial{'s' if len(best) > 1 else ''} {', '.join(map(str, best))}"
    return f"best {number(best_values[0]) if best_values else '?'} (trial {best[0]})"


def describe_trial(e: TrialFinished) -> Line:
    """number, state, value, best so far, the sampled parameters, duration."""
    what = scores_text(e.metrics, e.values) if e.state == "complete" else e.reason or e.state
    text = (f"trial {e.number} {e.state}: {what}; {best_text(e.best, e.metrics, e.best_values)}; "
            f"{params_text(e.params)}; {e.steps} steps in {e.duration_s:.1f} s")
    return Line(text, _TRIAL_LEVELS.get(e.state, "info"))


def _loss(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


# The events `describe` always has a line for; every other event is a continuous one.
Discrete = (RunStarted | History | RunPaused | Eval | LossScaleChange | CheckpointSaved | Log | RunFinished
            | RunFailed | SweepStarted | TrialStarted | TrialReport | TrialFinished | SweepFinished)


@overload
def describe(event: Discrete) -> Line: ...
@overload
def describe(event: Any) -> Line | None: ...
def describe(event: Any) -> Line | None:
    """The line for a discrete event; None for the continuous ones (steps, rank stats, traffic, memory)."""
    if isinstance(event, RunStarted):
        start = f" from step {event.first_step}" if event.first_step else ""
        return Line(f"run {event.run_id} started: preset {event.preset}, {event.n_params:,} parameters, "
                    f"{event.world_size} rank(s){threads_note(event)}, {event.total_steps} steps{start}"
                    + (f"; {event.network}" if event.network else ""))
    if isinstance(event, History):
        start = f"; curves from step {event.steps[0][0]}" if event.steps else ""
        return Line(f"resumed from {Path(event.parent).name} at step {event.step}: its history is drawn "
                    f"with this run ({len(event.steps)} steps, {len(event.evals)} evaluations{start})")
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
    return _describe_sweep(event)


def _describe_sweep(event: Any) -> Line | None:
    if isinstance(event, SweepStarted):
        goal = ", ".join(f"{d} {m}" for m, d in zip(event.metrics, event.directions))
        count = f"{event.n_trials} trials" if event.n_trials else "no trial limit"
        if event.timeout_s:
            count += f", at most {event.timeout_s:g} s"
        resumed = f", resuming with {event.existing} already" if event.existing else ""
        return Line(f"sweep {event.study} started: {goal}; {count}{resumed}; {event.jobs} job(s); study in "
                    f"{event.storage}")
    if isinstance(event, TrialStarted):
        job = f" (job {event.job})" if event.job else ""
        return Line(f"trial {event.number} started{job}: {params_text(event.params)}", "debug")
    if isinstance(event, TrialReport):
        return Line(f"trial {event.number} step {event.step}: {number(event.value)}", "debug")
    if isinstance(event, TrialFinished):
        return describe_trial(event)
    if isinstance(event, SweepFinished):
        counts = ", ".join(f"{n} {state}" for state, n in event.counts.items() if n)
        how = "stopped" if event.stopped else "finished"
        return Line(f"sweep {event.study} {how}: {counts or 'no trials'}", "success")
    return None
