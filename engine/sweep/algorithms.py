"""The sampler and the pruner a [sweep] section names (engine.config.vocabulary lists the names).

Samplers are seeded from sweep.seed, so the same preset samples the same sequence. Optuna does not store a
sampler's state: a resumed sweep builds a fresh one, which learns from every trial already in the study,
and each --jobs process has its own; the seed is mixed with the number of trials the study held and the
job's number, or a resumed sweep (and every job) would replay the first sampler's random picks.
Pruners measure a trial's progress in training steps, the step of each evaluation; the resource-based
ones (successive halving, Hyperband) take the first rung at the preset's evaluation interval.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import optuna
from optuna.pruners import BasePruner
from optuna.samplers import BaseSampler

from engine.config import Config
from engine.config.vocabulary import PRUNERS, SAMPLERS
from engine.sweep.space import grid


def _samplers(cfg: Config, seed: int) -> dict[str, Callable[[], BaseSampler]]:
    assert cfg.sweep is not None
    space = cfg.sweep.space
    return {
        "default": lambda: optuna.samplers.TPESampler(seed=seed),  # what create_study picks when unset
        "tpe": lambda: optuna.samplers.TPESampler(seed=seed),
        "random": lambda: optuna.samplers.RandomSampler(seed=seed),
        "grid": lambda: optuna.samplers.GridSampler(grid(space), seed=seed),
        "cmaes": lambda: optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False),
        "nsga2": lambda: optuna.samplers.NSGAIISampler(seed=seed),
    }


def _pruners(cfg: Config) -> dict[str, Callable[[], BasePruner]]:
    assert cfg.sweep is not None
    sweep, rung = cfg.sweep, max(1, cfg.train.eval_every or cfg.train.steps)
    return {
        "none": optuna.pruners.NopPruner,
        "median": lambda: optuna.pruners.MedianPruner(n_startup_trials=sweep.prune_startup_trials,
                                                      n_warmup_steps=sweep.prune_warmup_steps),
        "successive-halving": lambda: optuna.pruners.SuccessiveHalvingPruner(min_resource=rung),
        "hyperband": lambda: optuna.pruners.HyperbandPruner(min_resource=rung, max_resource=cfg.train.steps),
    }


def sampler_seed(seed: int, existing: int, job: int) -> int:
    """sweep.seed itself for a fresh sweep's first job; distinct, reproducible seeds otherwise."""
    if existing == job == 0:
        return seed
    return int(np.random.SeedSequence([seed, existing, job]).generate_state(1)[0])


def make_sampler(cfg: Config, existing: int = 0, job: int = 0) -> BaseSampler:
    """The sampler for a run of the sweep that starts with `existing` trials in the study, in job `job`."""
    assert cfg.sweep is not None
    table = _samplers(cfg, sampler_seed(cfg.sweep.seed, existing, job))
    assert table.keys() == SAMPLERS.keys(), "every sampler in settings.SAMPLERS has a constructor here"
    return table[cfg.sweep.sampler]()


def make_pruner(cfg: Config) -> BasePruner:
    assert cfg.sweep is not None
    table = _pruners(cfg)
    assert table.keys() == PRUNERS.keys(), "every pruner in settings.PRUNERS has a constructor here"
    return table[cfg.sweep.pruner]()
