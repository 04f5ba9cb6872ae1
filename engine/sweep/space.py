"""The search space of a preset's [sweep] section, in Optuna's terms, and the config one trial trains.

A parameter is named by its dotted config key ("optim.lr") in the study too, so the dashboard, trials.csv
and export-best all speak the preset's language. A trial's config is the swept preset with the sampled
values written in (tomlkit: the preset's comments stay), its [sweep] section removed, and its run folder
put inside the sweep's folder; it is validated like any preset, so an impossible combination is a
ConfigError naming the keys.
"""
from __future__ import annotations

from typing import Any

import tomlkit
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from engine.config import Config, SearchParam, presets


def distribution(param: SearchParam) -> BaseDistribution:
    """The Optuna distribution a SearchParam describes (already validated by engine.config)."""
    if param.type == "categorical":
        return CategoricalDistribution(list(param.choices or ()))
    assert param.low is not None and param.high is not None
    if param.type == "int":
        step = int(param.step or 1)
        return IntDistribution(int(param.low), int(param.high), log=param.log, step=step)
    return FloatDistribution(param.low, param.high, log=param.log, step=param.step)


def grid(space: dict[str, SearchParam]) -> dict[str, list]:
    """Every value of each parameter, for the grid sampler (floats need a step: engine.config.rules)."""
    out: dict[str, list] = {}
    for key, param in space.items():
        if param.type == "categorical":
            out[key] = list(param.choices or ())
            continue
        assert param.low is not None and param.high is not None and (param.step or param.type == "int")
        step = param.step or 1
        n = round((param.high - param.low) / step)
        values = [param.low + i * step for i in range(n + 1)]
        out[key] = [int(v) for v in values] if param.type == "int" else [float(v) for v in values]
    return out


def sample(trial: Any, space: dict[str, SearchParam]) -> dict[str, Any]:
    """Ask an Optuna trial for one value of every parameter, in the preset's order."""
    values: dict[str, Any] = {}
    for key, param in space.items():
        d = distribution(param)
        if isinstance(d, CategoricalDistribution):
            values[key] = trial.suggest_categorical(key, d.choices)
        elif isinstance(d, IntDistribution):
            values[key] = trial.suggest_int(key, d.low, d.high, step=d.step, log=d.log)
        else:
            assert isinstance(d, FloatDistribution)
            values[key] = trial.suggest_float(key, d.low, d.high, step=d.step, log=d.log)
    return values


def trial_document(doc: tomlkit.TOMLDocument, params: dict[str, Any], name: str,
                   out_dir: str | None = None) -> tomlkit.TOMLDocument:
    """A copy of the swept preset with the trial's values in, no [sweep] section, named `name`, and (if
    given) its run folders going to `out_dir`."""
    trial = tomlkit.parse(doc.as_string())
    trial.pop("sweep", None)
    for key, value in params.items():
        presets.set_value(trial, key, value)
    presets.set_value(trial, "name", name)
    if out_dir is not None:
        presets.set_value(trial, "run.out_dir", out_dir)
    return trial


def trial_config(doc: tomlkit.TOMLDocument, params: dict[str, Any], out_dir: str, name: str
                 ) -> tuple[Config, tomlkit.TOMLDocument]:
    """(validated Config, document) of one trial; ConfigError when the combination is impossible."""
    trial = trial_document(doc, params, name, out_dir)
    return presets.apply_overrides(trial, (), source=f"{name} ({_spelled(params)})"), trial


def _spelled(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in params.items())
