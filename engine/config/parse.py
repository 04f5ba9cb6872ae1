"""Typed run configuration: a frozen dataclass tree built from a plain dict and validated.

Pure (no files, no TOML): `from_dict` turns a dict (a parsed preset plus --set overrides) into a `Config`
or raises `ConfigError`, whose text is one line naming the source, the key, the problem and the fix;
a sweep's search space is parsed here too. The sections and fields themselves, each with a default and
a one-line doc (`describe(key)`) that presets and the UI reuse, are engine.config.schema (re-exported
here, so callers import from engine.config). What counts as valid (each setting, settings together,
against the loaded data) is engine.config.rules.

Decision on loss scaling: it only applies to fp16. `loss_scale = "dynamic"` (the default) is inert for
fp32/bf16/fp64, but a static number with those dtypes is rejected, since it would silently do nothing.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Mapping
from typing import Any

from engine.comm.emulation import NetworkEmulation
from engine.config.rules import (
    INT64,
    RULES,
    combination_problem,
    data_problem,
    one_of,
    sweep_problem,
)
from engine.config.schema import (
    FIELDS,
    SECTIONS,
    CheckpointConfig,
    Config,
    ConfigError,
    DataConfig,
    EmulateConfig,
    LogConfig,
    MemoryConfig,
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    PrecisionConfig,
    RunConfig,
    SearchParam,
    SweepConfig,
    TrainConfig,
    describe,
    field_type,
    setting_keys,
    split_key,
)
from engine.config.vocabulary import PARAM_TYPES
from engine.config.wording import did_you_mean, toml_repr

__all__ = ["CheckpointConfig", "Config", "ConfigError", "DataConfig", "EmulateConfig", "LogConfig",
           "MemoryConfig", "ModelConfig", "OptimConfig", "ParallelConfig", "PrecisionConfig", "RunConfig",
           "SearchParam", "SweepConfig", "TrainConfig", "check_against_data", "describe", "field_type",
           "from_dict", "network_emulation", "replace", "setting_keys", "split_key", "to_dict", "toml_repr"]


def from_dict(d: Mapping[str, Any], source: str = "<config>") -> Config:
    """Validate a plain dict (parsed TOML) into a Config; raise ConfigError naming `source` and the key."""
    try:
        cfg = _build(d)
        if cfg.sweep is not None:
            if problem := sweep_problem(cfg.sweep):
                raise ConfigError(*problem)
            _check_sweep_bounds(cfg)
        return cfg
    except ConfigError as err:
        err.source = source
        raise


def to_dict(cfg: Any) -> Any:
    """Plain dict/list form of a Config (None dropped, tuples as lists): what TOML can hold."""
    if dataclasses.is_dataclass(cfg):
        pairs = ((f.name, getattr(cfg, f.name)) for f in dataclasses.fields(cfg))
        return {k: to_dict(v) for k, v in pairs if v is not None}
    if isinstance(cfg, dict):
        return {k: to_dict(v) for k, v in cfg.items()}
    if isinstance(cfg, tuple):
        return [to_dict(v) for v in cfg]
    return cfg


def replace(cfg: Config, dotted_key: str, value: Any) -> Config:
    """A copy of cfg with one dotted key changed, validated like a preset."""
    d = to_dict(cfg)
    *parents, last = split_key(dotted_key)
    node = d
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return from_dict(d, source=f"replace {dotted_key}")


def network_emulation(cfg: Config) -> NetworkEmulation | None:
    """The network emulation cfg asks for (engine.comm.emulation), or None for a real network."""
    emulation = NetworkEmulation(**to_dict(cfg.emulate), ranks_per_node=cfg.parallel.ranks_per_node)
    return emulation if emulation.active else None


def check_against_data(cfg: Config, n_train_tokens: int, n_val_tokens: int | None = None,
                       data_vocab: int | None = None, source: str = "data") -> None:
    """Checks that need the loaded data (engine.config.rules.data_problem); ConfigError names `source`."""
    if problem := data_problem(cfg, n_train_tokens, n_val_tokens, data_vocab):
        raise ConfigError(*problem, source)


# ---- validation internals (the rules themselves: engine.config.rules) ----

def _coerce(key: str, value: Any, hint: Any) -> Any:
    """Value converted to the field's type, or ConfigError (ints count as floats; bools never as ints)."""
    is_num = isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is bool and isinstance(value, bool) or hint is str and isinstance(value, str):
        return value
    if hint is int and is_num and isinstance(value, int):
        if not -INT64 <= value < INT64:  # numpy (and every rank) would overflow on it
            raise ConfigError(key, f"{value} does not fit a 64-bit integer", "use a smaller number")
        return value
    if hint is float and is_num:
        return float(value)
    if hint == (str | float) and (isinstance(value, str) or is_num):
        return value if isinstance(value, str) else float(value)
    if hint == tuple[int, ...] and isinstance(value, (list, tuple)) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        return tuple(value)
    names = isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
    if hint == (str | tuple[str, ...]) and (isinstance(value, str) or names):
        return value if isinstance(value, str) else tuple(value)
    if hint == tuple[str, ...] and names:
        return tuple(value)
    wanted = {bool: "true or false", str: "a string", int: "a whole number", float: "a number",
              tuple[int, ...]: "a list of whole numbers", str | tuple[str, ...]: "a name or a list of names",
              tuple[str, ...]: "a list of strings"
              }.get(hint, '"dynamic" or a number')
    default = FIELDS[key][1].default
    if hint == tuple[str, ...] and isinstance(value, str):
        default = [value]  # one name where a list belongs: the fix is the list of it
    raise ConfigError(key, f"expected {wanted}, got {toml_repr(value)} ({type(value).__name__})",
                      f"write e.g. {key.rpartition('.')[2]} = {toml_repr(default)}")


def _build_fields(cls: type, prefix: str, d: Mapping[str, Any]) -> dict[str, Any]:
    names = [f.name for f in dataclasses.fields(cls) if f.name not in SECTIONS and f.name != "space"]
    kwargs = {}
    for name, value in d.items():
        key = prefix + name
        if name not in names:
            raise ConfigError(key, "unknown key", did_you_mean(key, list(FIELDS)))
        kwargs[name] = _coerce(key, value, FIELDS[key][0])
        if key in RULES and (problem := RULES[key](kwargs[name])):
            raise ConfigError(key, *problem)
    return kwargs


def _build(d: Mapping[str, Any]) -> Config:
    if not isinstance(d, Mapping):
        raise ConfigError("", f"expected a table of settings, got {type(d).__name__}", "pass a TOML document")
    top = {k: v for k, v in d.items() if k not in SECTIONS}
    for name, value in top.items():
        if isinstance(value, Mapping) and name not in FIELDS:
            close = difflib.get_close_matches(name, list(SECTIONS), n=1, cutoff=0.6)
            raise ConfigError(f"[{name}]", "unknown section", f"did you mean [{close[0]}]?" if close
                              else "valid sections: " + ", ".join(SECTIONS))
    kwargs = _build_fields(Config, "", top)
    for name, cls in SECTIONS.items():
        if name not in d:
            continue
        if not isinstance(d[name], Mapping):
            raise ConfigError(name, f"expected a [{name}] table, got {toml_repr(d[name])}",
                              f"write the settings under a [{name}] header")
        body = dict(d[name])
        space = body.pop("space", None) if name == "sweep" else None
        kwargs[name] = cls(**_build_fields(cls, name + ".", body))
        if name == "sweep":
            kwargs[name] = dataclasses.replace(kwargs[name], space=_build_space(space))
    cfg = Config(**kwargs)
    if problem := combination_problem(cfg):
        raise ConfigError(*problem)
    return cfg


def _flatten_space(node: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """[sweep.space."optim.lr"] and [sweep.space.optim.lr] both name the key optim.lr."""
    out = []
    for name, value in node.items():
        key = f"{prefix}.{name}" if prefix else name
        nested = isinstance(value, Mapping) and "type" not in value and value and all(
            isinstance(v, Mapping) for v in value.values())
        out += _flatten_space(value, key) if nested else [(key, value)]
    return out


def _build_space(space: Any) -> dict[str, SearchParam]:
    if not isinstance(space, Mapping) or not space:
        raise ConfigError("sweep.space", "a sweep needs at least one parameter to search",
                          'add e.g. [sweep.space."optim.lr"] with type = "float", low, high, log = true')
    return {key: _build_param(key, spec) for key, spec in _flatten_space(space)}


def _build_param(key: str, spec: Any) -> SearchParam:
    name = f"sweep.space.{key}"
    if key not in FIELDS or key.startswith("sweep.") or key in ("name", "description"):
        raise ConfigError(name, f"{key} is not a setting a sweep can vary",
                          did_you_mean(key, [k for k in FIELDS if not k.startswith("sweep.")]))
    if not isinstance(spec, Mapping):
        raise ConfigError(name, f"expected a table, got {toml_repr(spec)}", 'write {type="float", low, high}')
    attrs = [f.name for f in dataclasses.fields(SearchParam)]
    for attr in spec:
        if attr not in attrs:
            raise ConfigError(f"{name}.{attr}", "unknown key", did_you_mean(attr, attrs))
    kind = spec.get("type", "float")
    hint = FIELDS[key][0]
    if problem := one_of(*PARAM_TYPES)(kind):
        raise ConfigError(f"{name}.type", *problem)
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, (list, tuple)) or not choices:
            raise ConfigError(f"{name}.choices", "categorical needs a non-empty list", "write choices = [..]")
        return SearchParam(type=kind, choices=tuple(_coerce(key, c, hint) for c in choices))
    if (kind == "float") != (hint is float) or hint not in (int, float):
        fits = {int: '"int" or "categorical"', float: '"float" or "categorical"'}.get(hint, '"categorical"')
        raise ConfigError(f"{name}.type", f'"{kind}" does not fit {key}', f"use type = {fits}")
    bounds = {}
    for attr in ("low", "high"):
        value = spec.get(attr)
        wanted = int if kind == "int" else (int, float)
        if value is None or isinstance(value, bool) or not isinstance(value, wanted):
            raise ConfigError(f"{name}.{attr}", f"{kind} search needs a number, got {toml_repr(value)}",
                              f"write {attr} = a {'whole ' if kind == 'int' else ''}number")
        bounds[attr] = value if kind == "int" else float(value)
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise ConfigError(f"{name}.log", f"expected true or false, got {toml_repr(log)}", "write log = true")
    if bounds["low"] >= bounds["high"]:
        raise ConfigError(f"{name}.low", f"{bounds['low']} is not below high {bounds['high']}", "swap them")
    if log and bounds["low"] <= 0:
        raise ConfigError(f"{name}.low", "a log-scale search needs low > 0", "raise low or set log = false")
    step = _build_step(name, kind, spec.get("step"), log, bounds["low"], bounds["high"])
    return SearchParam(type=kind, low=bounds["low"], high=bounds["high"], log=log, step=step)


def _build_step(name: str, kind: str, step: Any, log: bool, low: float, high: float) -> float | None:
    """A grid step that Optuna accepts as it is: positive, whole for an int, spanning low..high exactly."""
    if step is None:
        return None
    whole = kind == "int"
    if isinstance(step, bool) or not isinstance(step, int if whole else (int, float)) or step <= 0:
        raise ConfigError(f"{name}.step", f"expected a positive {'whole ' if whole else ''}number, got "
                          f"{toml_repr(step)}", "write e.g. step = " + ("2" if whole else "0.1"))
    if log and (not whole or step != 1):
        raise ConfigError(f"{name}.step", "a log-scale search cannot also step" + ("" if whole else
                          " (floats)") + (" other than 1" if whole else ""), "remove step or set log = false")
    spans = (high - low) / step
    if not math.isclose(spans, round(spans), rel_tol=0, abs_tol=1e-9):
        raise ConfigError(f"{name}.step", f"high - low = {high - low:g} is not a multiple of {step:g}",
                          f"use a step that divides it, or move high to {low + math.floor(spans) * step:g}")
    return step if whole else float(step)


def _check_sweep_bounds(cfg: Config) -> None:
    """Every trial must be a valid config: try each bound / choice in the full config."""
    if cfg.sweep is None:
        return
    base = {k: v for k, v in to_dict(cfg).items() if k != "sweep"}
    for key, param in cfg.sweep.space.items():
        tries = [("low", param.low), ("high", param.high)] if param.choices is None else [
            ("choices", c) for c in param.choices]
        for attr, value in tries:
            trial = to_dict(base)
            section, _, last = key.rpartition(".")
            (trial.setdefault(section, {}) if section else trial)[last] = value
            try:
                _build(trial)
            except ConfigError as err:
                problem = f"a trial with {key} = {toml_repr(value)} is invalid ({err.key}: {err.problem})"
                fix = f"narrow the range or change {err.key}"
                raise ConfigError(f"sweep.space.{key}.{attr}", problem, fix) from None
