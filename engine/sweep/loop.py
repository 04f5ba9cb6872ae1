"""Trials one after another on the calling thread: the loop a single-process sweep and every --jobs
process run.

After each trial an Optuna callback emits its TrialFinished, rewrites trials.csv (so it is current
whenever the sweep stops) and, when a stop was asked for, calls study.stop() — on this, the sweep's own
thread, never the UI's.
"""
from __future__ import annotations

import threading

import optuna
from optuna.trial import FrozenTrial

from engine import events as ev
from engine.sweep.objective import Objective, TrialFailed
from engine.sweep.results import best_trials, outcome, write_trials_csv
from engine.sweep.study import Sweep


def run_trials(sweep: Sweep, study: optuna.Study, emit, stop_event: threading.Event,
               finish_event: threading.Event, n_trials: int | None, timeout_s: float, job: int = 0,
               live: bool = True) -> None:
    """Trials on this thread, one after another, until `n_trials` (None: no limit), the time or a stop."""
    def after_trial(study: optuna.Study, trial: FrozenTrial) -> None:
        emit(finished_event(study, trial, sweep.metrics))
        write_trials_csv(study, sweep.metrics, sweep.sweep_dir)
        if stop_event.is_set() or finish_event.is_set():
            study.stop()  # on this, the sweep's own thread: Optuna's stop, after the trial just told

    objective = Objective(sweep, emit, stop_event, job=job, live=live)
    study.optimize(objective, n_trials=n_trials, timeout=timeout_s or None, catch=(TrialFailed,),
                   callbacks=[after_trial])


def finished_event(study: optuna.Study, t: FrozenTrial, metrics: list[str]) -> ev.TrialFinished:
    best = best_trials(study)
    return ev.TrialFinished(
        number=t.number, state=outcome(t), metrics=metrics, values=list(t.values) if t.values else None,
        params=dict(t.params),
        duration_s=t.duration.total_seconds() if t.duration else 0.0, steps=t.user_attrs.get("steps", 0),
        reason=t.user_attrs.get("reason", ""), run_dir=t.user_attrs.get("run_dir", ""),
        best=[b.number for b in best], best_values=list(best[0].values) if len(best) == 1 else None)
