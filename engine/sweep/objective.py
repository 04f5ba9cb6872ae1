"""One trial: sample a configuration, check it fits, train it for real, score it.

What can end a trial, and how it is recorded (the reason always in the trial's user attrs):

    complete   trained to its end; its metrics are the values (one per metric)
    pruned     the pruner stopped it at an evaluation (Optuna's PRUNED; it trained fewer steps)
    rejected   the estimator's peak memory per rank is above sweep.memory_budget_mb: never trained
    failed     an impossible combination (the sampled config does not validate), a run that diverged
               (a loss that is not finite), a measured peak above the budget, a failed rank, a stop
               request, or no value for a metric

Only a Ctrl-C leaves the sweep; every other ending is the trial's own, and the sweep goes on.

Threads: the objective runs on the sweep's thread; the training run's events arrive on a rank's thread
(threads backend) or on this thread (the processes backend relays them). Optuna's storages are
thread-safe, so the pruning decision is taken right where an evaluation is reported, before the rank goes
on: a pruned trial stops after exactly one more step, whatever the machine's load.
"""
from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any, NoReturn

import optuna

from engine import events as ev
from engine.comm.base import RankFailure
from engine.config import Config, ConfigError, to_dict
from engine.config.build import vocab_size
from engine.config.vocabulary import METRICS
from engine.data import DataError
from engine.memory.estimator import estimate
from engine.run.job import one_line, run_training
from engine.sweep.metrics import MB, MetricTracker
from engine.sweep.space import sample, trial_config
from engine.sweep.storage import claim


class TrialFailed(Exception):
    """A trial that ends without a score (failed or rejected); its reason is in its user attrs."""


class Objective:
    """Optuna's objective for one sweep; `job` names the process it runs in (--jobs), `live` whether the
    training runs' own events go to `emit` as well as the trial events."""

    def __init__(self, sweep: Any, emit, stop_event: threading.Event, job: int = 0, live: bool = True):
        self.sweep, self.emit, self.stop_event, self.job, self.live = sweep, emit, stop_event, job, live
        self.cfg: Config = sweep.cfg
        assert self.cfg.sweep is not None
        self.metrics, self.budget_mb = sweep.metrics, self.cfg.sweep.memory_budget_mb
        self._vocab: dict[str, int] = {}  # the data section -> its vocabulary, for the estimator

    def __call__(self, trial: optuna.Trial) -> float | list[float]:
        try:
            claim(trial)
            trial.set_user_attr("job", self.job)
            params = sample(trial, self.cfg.sweep.space)  # type: ignore[union-attr]
            self.emit(ev.TrialStarted(number=trial.number, params=params, job=self.job))
            return self._run(trial, params)
        except KeyboardInterrupt:
            _record(trial, "failed", "interrupted (Ctrl-C)")
            raise

    def _run(self, trial: optuna.Trial, params: dict) -> float | list[float]:
        name = f"{self.sweep.study_name}-trial-{trial.number}"
        try:
            cfg, doc = trial_config(self.sweep.doc, params, str(self.sweep.sweep_dir), name)
            peak_mb = self._estimated_peak_mb(cfg)
        except (ConfigError, DataError) as e:
            _fail(trial, "failed", f"impossible combination: {e}")
        trial.set_user_attr("estimated_peak_mb", round(peak_mb, 3))
        if self.budget_mb and peak_mb > self.budget_mb:
            _fail(trial, "rejected", f"estimated peak {peak_mb:.1f} MB per rank is above the budget of "
                  f"{self.budget_mb:g} MB")
        run = _TrialRun(self, trial)
        try:
            run_training(cfg, on_event=run, stop_event=run.stop, preset_doc=doc)
        except KeyboardInterrupt:
            run.record()
            raise
        except Exception as e:  # a failed rank, a run that could not start: the trial's, not the sweep's
            run.record()
            failed = f"rank {e.rank} failed: {e.cause}" if isinstance(e, RankFailure) else one_line(e)
            _fail(trial, "failed", run.problem or failed)
        run.record()
        return run.score()

    def _estimated_peak_mb(self, cfg: Config) -> float:
        data_key = repr(to_dict(cfg.data))
        if cfg.model.kind == "gpt" and data_key not in self._vocab:
            self._vocab[data_key] = vocab_size(cfg)
        _, categories = estimate(cfg, self._vocab.get(data_key)).peak()
        return sum(categories.values()) / MB


class _TrialRun:
    """The event subscriber of one trial's training run: metrics, pruning, divergence, the budget, and the
    sweep's stop request, each of which may stop the run through its own stop event."""

    def __init__(self, objective: Objective, trial: optuna.Trial):
        self.objective, self.trial = objective, trial
        self.metrics = objective.metrics
        self.tracker = MetricTracker()
        self.stop = threading.Event()
        self.run_dir = ""
        self.pruned: str | None = None
        self.problem: str | None = None  # why the run was stopped as a failure

    def __call__(self, event: Any) -> None:
        event = ev.as_event(event)
        self.tracker(event)
        o = self.objective
        if o.live:
            o.emit(event)
        if isinstance(event, ev.RunStarted):
            self.run_dir = str(Path(o.sweep.sweep_dir) / event.run_id)
        if o.stop_event.is_set() and not self.stop.is_set():
            self._stop("stopped before its end (a stop request)")
        if self.tracker.diverged and not self.stop.is_set():
            self._stop(self.tracker.diverged)
        peak = self.tracker.peak_memory_mb
        if o.budget_mb and peak is not None and peak > o.budget_mb and not self.stop.is_set():
            self._stop(f"measured peak {peak:.1f} MB per rank is above the budget of {o.budget_mb:g} MB")
        if isinstance(event, ev.Eval) and event.step > 0 and not self.stop.is_set():
            self._report(event.step)

    def _stop(self, problem: str) -> None:
        self.problem = problem
        self.stop.set()

    def _report(self, step: int) -> None:
        value = self.tracker.value(self.metrics[0])
        if value is None or not math.isfinite(value):
            return
        self.objective.emit(ev.TrialReport(number=self.trial.number, step=step, value=value))
        if len(self.metrics) > 1:
            return  # Optuna neither stores nor prunes on intermediate values of multi-objective trials
        try:
            self.trial.report(value, step)
            prune = self.trial.should_prune()
        except Exception as e:  # the storage failed us: end the trial rather than lose the decision
            self._stop(f"could not report to the study: {one_line(e)}")
            return
        if prune:
            self.pruned = f"pruned at step {step}: {self.metrics[0]} {value:.4g}"
            self.stop.set()

    def record(self) -> None:
        """Everything the trial measured, as user attrs (trials.csv and the dashboard show them)."""
        t = self.trial
        t.set_user_attr("steps", self.tracker.steps)
        t.set_user_attr("run_dir", self.run_dir)
        for name in METRICS:
            value = self.tracker.value(name)
            if value is not None and math.isfinite(value):
                t.set_user_attr(f"metric.{name}", value)

    def score(self) -> float | list[float]:
        if self.problem:
            _fail(self.trial, "failed", self.problem)
        if self.pruned:
            _record(self.trial, "pruned", self.pruned)
            raise optuna.TrialPruned(self.pruned)
        values = [self.tracker.value(m) for m in self.metrics]
        missing = [m for m, v in zip(self.metrics, values) if v is None or not math.isfinite(v)]
        if missing:
            _fail(self.trial, "failed", f"no value for {', '.join(missing)} (the run measured none)")
        _record(self.trial, "complete", "")
        scores = [float(v) for v in values if v is not None]
        return scores[0] if len(scores) == 1 else scores


def _record(trial: optuna.Trial, outcome: str, reason: str) -> None:
    trial.set_user_attr("outcome", outcome)
    if reason:
        trial.set_user_attr("reason", reason)


def _fail(trial: optuna.Trial, outcome: str, reason: str) -> NoReturn:
    _record(trial, outcome, reason)
    raise TrialFailed(reason)
