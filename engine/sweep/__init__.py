"""Optuna sweeps over a preset: each trial is one real training run, recorded in the sweep's folder.

    file            what
    settings.py     the allowed metrics, directions, samplers, pruners, parameter types, outcomes (pure)
    space.py        the preset's search space -> Optuna distributions; a trial's parameters -> its config
    metrics.py      a trial's metrics, folded from its events (the values pruners see at evaluations)
    objective.py    one trial: memory-budget check, the training run, pruning, failure reasons
    storage.py      where a study lives (SQLite, a journal file, any URL); the sweep folder's sweep.json
    storage_errors.py  a damaged, locked or read-only study.db as one line in plain words (SweepError)
    algorithms.py   the sampler and the pruner a [sweep] section names
    runner.py       create or resume the study, run trials until the count or the time is spent
    jobs.py         --jobs J: J processes sharing one study, their events relayed to the caller
    results.py      best trial or Pareto front, trials.csv, the best configuration as a preset

A sweep's folder, <run.out_dir>/sweep-<study>/: sweep.json (study name, storage), preset.toml (the
preset as swept), study.db or journal.log (the storage, unless a URL was given), trials.csv, and one
run folder per trial. This package imports nothing at package level, so engine.config can read
settings.py without loading Optuna.
"""
