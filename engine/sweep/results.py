"""What a sweep found: each trial as a row, the best trial (or the Pareto front), trials.csv, and the best
configuration written out as a preset that keeps the swept preset's comments."""
from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import optuna
import tomlkit
from optuna.trial import FrozenTrial, TrialState

from engine.config import ConfigError, presets
from engine.config.vocabulary import METRICS
from engine.run import atomic_file
from engine.sweep.space import trial_document

TRIALS_CSV = "trials.csv"
_STATES = {TrialState.COMPLETE: "complete", TrialState.PRUNED: "pruned", TrialState.FAIL: "failed",
           TrialState.RUNNING: "running", TrialState.WAITING: "running"}


def outcome(t: FrozenTrial) -> str:
    """How the trial ended, in engine.config.vocabulary.OUTCOMES (a rejected trial is FAIL to Optuna)."""
    recorded = t.user_attrs.get("outcome")
    return recorded if recorded and t.state.is_finished() else _STATES[t.state]


def best_trials(study: optuna.Study) -> list[FrozenTrial]:
    """The best complete trial (one metric), or the Pareto front (several); [] before any completes."""
    if len(study.directions) > 1:
        return sorted(study.best_trials, key=lambda t: t.number)
    try:
        return [study.best_trial]
    except ValueError:
        return []


def trial_row(t: FrozenTrial, metrics: list[str]) -> dict[str, Any]:
    """One trial as the tables and trials.csv show it."""
    values = t.values or [None] * len(metrics)
    duration = t.duration.total_seconds() if t.duration is not None else None
    attrs = t.user_attrs
    return {"number": t.number, "state": outcome(t), **dict(zip(metrics, values)), "params": dict(t.params),
            "duration_s": duration, "steps": attrs.get("steps"), "reason": attrs.get("reason", ""),
            "estimated_peak_mb": attrs.get("estimated_peak_mb"), "run_dir": attrs.get("run_dir", "")}


def write_trials_csv(study: optuna.Study, metrics: list[str], sweep_dir: Path) -> Path:
    """trials.csv in the sweep folder, rewritten whole and atomically: one row per trial, oldest first.
    Columns: number, state, the metrics scored, each parameter, every metric measured, duration, steps,
    estimated peak, reason, run folder."""
    trials = study.get_trials(deepcopy=False)
    params = list(dict.fromkeys(k for t in trials for k in t.params))
    measured = [f"metric.{m}" for m in METRICS]
    columns = ["number", "state", *metrics, *params, *measured, "duration_s", "steps", "estimated_peak_mb",
               "reason", "run_dir"]
    out = io.StringIO()
    writer = csv.DictWriter(out, columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for t in trials:
        row = trial_row(t, metrics)
        row |= row.pop("params") | {k: t.user_attrs[k] for k in measured if k in t.user_attrs}
        writer.writerow({k: "" if v is None else v for k, v in row.items()})
    path = Path(sweep_dir) / TRIALS_CSV
    atomic_file.atomic_write_text(path, out.getvalue())
    return path


def export_best(sweep: Any, study: optuna.Study, out_path: Path, number: int | None = None) -> FrozenTrial:
    """Write the best trial's configuration (or trial `number`'s) as a preset at `out_path`: the swept
    preset with the trial's values written in, its comments kept, the [sweep] section and the sweep's run
    folder left out. ConfigError when there is no such trial."""
    trial = _pick(study, number, sweep.sweep_dir)
    out_path = Path(out_path)
    doc = trial_document(sweep.doc, trial.params, out_path.stem)
    values = ", ".join(f"{m} {v:.4g}" for m, v in zip(sweep.metrics, trial.values or []))
    presets.set_value(doc, "description", f"trial {trial.number} of sweep {sweep.study_name}: {values}")
    presets.apply_overrides(tomlkit.parse(doc.as_string()), (), source=str(out_path))  # it loads as it is
    presets.save_preset(doc, out_path)
    return trial


def _pick(study: optuna.Study, number: int | None, sweep_dir: Path) -> FrozenTrial:
    if number is None:
        best = best_trials(study)
        if not best:
            raise ConfigError("", "no trial has completed yet", "run the sweep (or let it finish a trial)",
                              source=str(sweep_dir))
        if len(best) > 1:
            numbers = ", ".join(str(t.number) for t in best)
            raise ConfigError("", f"several trials are best (the Pareto front: {numbers})",
                              "choose one with --trial N", source=str(sweep_dir))
        return best[0]
    found = [t for t in study.get_trials(deepcopy=False) if t.number == number]
    if not found or found[0].state != TrialState.COMPLETE:
        done = [t.number for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
        raise ConfigError("", f"trial {number} {'did not complete' if found else 'does not exist'}",
                          f"choose a complete trial: {done}", source=str(sweep_dir))
    return found[0]
