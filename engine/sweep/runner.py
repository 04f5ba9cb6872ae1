"""Running a sweep: trials until the count, the time or a stop request ends it, in this process or in
--jobs processes sharing the study.

`run_sweep` emits SweepStarted, one TrialStarted / TrialReport... / TrialFinished per trial (with the
training run's own events between them), then SweepFinished. sweep.n_trials counts the trials the study
holds, so running the same sweep again continues where it stopped, numbering on from the last trial.
Stopping: `finish_event` ends the sweep after the running trial; `stop_event` also stops the running
trial, which is then recorded as failed. Ctrl-C stops the running trial and raises KeyboardInterrupt
once what happened is recorded.
"""
from __future__ import annotations

import dataclasses
import threading

import optuna
from optuna.trial import TrialState

from engine import events as ev
from engine.config.vocabulary import OUTCOMES
from engine.sweep.jobs import run_jobs
from engine.sweep.loop import finished_event, run_trials
from engine.sweep.results import best_trials, outcome, write_trials_csv
from engine.sweep.storage import fail_orphans
from engine.sweep.storage_errors import storage_errors
from engine.sweep.study import Sweep, open_study


def run_sweep(sweep: Sweep, emit, stop_event: threading.Event | None = None,
              finish_event: threading.Event | None = None, jobs: int = 1) -> dict:
    """Run the sweep's remaining trials (in `jobs` processes); returns the outcome counts and the best.
    SweepError (one line) when the study's storage fails it on the way (damaged, locked, read-only)."""
    with storage_errors(sweep.storage, sweep.sweep_dir):
        return _run_sweep(sweep, emit, stop_event, finish_event, jobs)


def _run_sweep(sweep: Sweep, emit, stop_event: threading.Event | None, finish_event: threading.Event | None,
               jobs: int) -> dict:
    assert sweep.cfg.sweep is not None
    stop_event, finish_event = stop_event or threading.Event(), finish_event or threading.Event()
    study = open_study(sweep)
    fail_orphans(study)
    existing = len(study.get_trials(deepcopy=False))
    n_trials, timeout_s = sweep.cfg.sweep.n_trials, sweep.cfg.sweep.timeout_s
    remaining = max(0, n_trials - existing) if n_trials else None
    emit(ev.SweepStarted(study=sweep.study_name, sweep_dir=str(sweep.sweep_dir),
                         storage=sweep.storage.describe(sweep.sweep_dir), metrics=sweep.metrics,
                         directions=sweep.directions, n_trials=n_trials, timeout_s=timeout_s,
                         existing=existing, jobs=jobs))
    _report_earlier_trials(study, sweep, emit)
    interrupted = False
    try:
        if remaining != 0 and jobs > 1:
            run_jobs(sweep, jobs, remaining, timeout_s, emit, stop_event, finish_event)
            fail_orphans(study)  # a job process that died left its trial running
        elif remaining != 0:
            run_trials(sweep, study, emit, stop_event, finish_event, remaining, timeout_s)
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        write_trials_csv(study, sweep.metrics, sweep.sweep_dir)
        result = summarize(study)
        stopped = interrupted or stop_event.is_set() or finish_event.is_set()
        emit(ev.SweepFinished(study=sweep.study_name, counts=result["counts"], best=result["best"],
                              stopped=stopped))
    return result | {"stopped": stopped, "sweep_dir": str(sweep.sweep_dir)}


def _report_earlier_trials(study: optuna.Study, sweep: Sweep, emit) -> None:
    """The finished trials a resumed sweep already holds, as TrialFinished(resumed=True), each with the
    best value as it stood after it (one metric), so the workbench's table and history show them too."""
    best: tuple[float, int] | None = None
    sign = 1.0 if sweep.directions[0] == "minimize" else -1.0
    for t in study.get_trials(deepcopy=False):
        if not t.state.is_finished():
            continue
        event = dataclasses.replace(finished_event(study, t, sweep.metrics), resumed=True)
        if len(sweep.metrics) == 1:
            better = best is None or (t.values is not None and sign * t.values[0] < sign * best[0])
            if t.state == TrialState.COMPLETE and t.values and better:
                best = (t.values[0], t.number)
            event = dataclasses.replace(event, best=[best[1]] if best else [],
                                        best_values=[best[0]] if best else None)
        emit(event)


def summarize(study: optuna.Study) -> dict:
    """Outcome -> number of trials, and the best trial's number (or the Pareto front's numbers)."""
    counts = dict.fromkeys(OUTCOMES, 0)
    for t in study.get_trials(deepcopy=False):
        counts[outcome(t)] += 1
    return {"counts": counts, "best": [t.number for t in best_trials(study)]}
