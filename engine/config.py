"""Typed run configuration: a frozen dataclass tree built from a plain dict and validated.

Pure (no files, no TOML): `from_dict` turns a dict (a parsed preset plus --set overrides) into a `Config`
or raises `ConfigError`, whose text is one line naming the source, the key, the problem and the fix.
Every field has a default and a one-line doc (`describe(key)`) that presets and the UI reuse. What
counts as valid (each setting, settings together, against the loaded data) is engine.config_rules.

Decision on loss scaling: it only applies to fp16. `loss_scale = "dynamic"` (the default) is inert for
fp32/bf16/fp64, but a static number with those dtypes is rejected, since it would silently do nothing.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.comm.collectives import ALGORITHMS
from engine.comm.emulation import NetworkEmulation
from engine.comm.launch import BACKENDS
from engine.config_rules import (
    INT64,
    RULES,
    choices_doc,
    combination_problem,
    data_problem,
    did_you_mean,
    one_of,
    sweep_problem,
    toml_repr,
)
from engine.data import DATA_KINDS
from engine.dtypes import DTYPES
from engine.nn import MODEL_KINDS
from engine.optim import SCHEDULES
from engine.recompute import CHECKPOINTING
from engine.sinks import SINKS
from engine.sweep.settings import DIRECTIONS, METRICS, PARAM_TYPES, PRUNERS, SAMPLERS


class ConfigError(ValueError):
    """A mistake in a preset or override. str() is one line: `<source>[:line]: <key>: <problem>; <fix>`."""

    def __init__(self, key: str, problem: str, fix: str, source: str = "<config>", line: int | None = None):
        super().__init__(problem)
        self.key, self.problem, self.fix, self.source, self.line = key, problem, fix, source, line

    def __str__(self) -> str:
        where = f"{self.source}:{self.line}" if self.line else self.source
        head = f"{where}: {self.key}:" if self.key else f"{where}:"
        text = f"{head} {self.problem}; {self.fix}"
        return " ".join(text.split())  # one line, whatever the parts contain

    def __reduce__(self):  # picklable, so it can cross a process boundary
        return ConfigError, (self.key, self.problem, self.fix, self.source, self.line)


def _f(default: Any, doc: str, only: tuple[str, ...] = ()) -> Any:
    """A field with its default and the one-line doc shown in presets and the UI. `only`: the
    model.kind (in [model]) or data.kind (in [data]) values that read it; set to anything but its
    default with another kind, it is an error (engine.config_rules.unread_setting_problem)."""
    suffix = f" ({', '.join(only)})" if only else ""
    return field(default=default, metadata={"doc": doc + suffix, "only": only})


def _section(cls: type, doc: str) -> Any:
    return field(default_factory=cls, metadata={"doc": doc})


@dataclass(frozen=True)
class ModelConfig:
    kind: str = _f("gpt", " or ".join(f'"{k}" ({what})' for k, (_, what) in MODEL_KINDS.items()))
    n_layer: int = _f(2, "transformer blocks", only=("gpt",))
    n_head: int = _f(4, "attention heads per block; must divide n_embd", only=("gpt",))
    n_embd: int = _f(64, "residual stream width", only=("gpt",))
    block_size: int = _f(32, "context length in tokens", only=("gpt",))
    vocab_size: int = _f(0, "token vocabulary; 0 = from the data (corpus characters or synthetic default)",
                         only=("gpt",))
    dropout: float = _f(0.0, "dropout probability, 0 <= p < 1")
    tie_weights: bool = _f(True, "share the token embedding with the output layer", only=("gpt",))
    bias: bool = _f(True, "biases in Linear and LayerNorm layers")
    widths: tuple[int, ...] = _f((784, 1024, 1024, 10), "layer widths from inputs to classes", only=("mlp",))


@dataclass(frozen=True)
class DataConfig:
    kind: str = _f("stdlib", choices_doc(DATA_KINDS))
    path: str = _f("", "text file or folder to train on", only=("text",))
    max_chars: int = _f(0, "read at most this many characters of the corpus; 0 = all",
                        only=("stdlib", "text"))
    val_fraction: float = _f(0.1, "share of the data held out for validation, 0 < f <= 0.5")
    n_samples: int = _f(8192, "synthetic data size: samples, or sequences of block_size tokens (lm)",
                        only=("synthetic-lm", "synthetic-classification"))


@dataclass(frozen=True)
class TrainConfig:
    steps: int = _f(300, "optimizer steps")
    global_batch: int = _f(32, "sequences/samples per optimizer step over all ranks and micro-batches")
    micro_batches: int = _f(1, "gradient-accumulation micro-batches per step on each rank")
    eval_every: int = _f(50, "steps between validation passes; 0 = only at start and end")
    eval_batches: int = _f(4, "batches averaged per validation pass")
    log_every: int = _f(10, "steps between progress lines in headless mode")


@dataclass(frozen=True)
class OptimConfig:
    lr: float = _f(3e-4, "peak learning rate (AdamW)")
    min_lr: float = _f(0.0, "learning rate at the end of the cosine decay")
    schedule: str = _f("cosine", f"{choices_doc(SCHEDULES)} (linear warmup, then cosine to min_lr)")
    warmup_steps: int = _f(0, "steps of linear warmup from 0 to lr")
    weight_decay: float = _f(0.1, "decoupled weight decay on matrices (not biases, LayerNorm)")
    beta1: float = _f(0.9, "Adam first-moment decay")
    beta2: float = _f(0.95, "Adam second-moment decay")
    eps: float = _f(1e-8, "Adam denominator epsilon")
    grad_clip: float = _f(1.0, "clip the global gradient norm to this; 0 = off")


@dataclass(frozen=True)
class ParallelConfig:
    backend: str = _f("threads", choices_doc(BACKENDS))
    world_size: int = _f(1, "data-parallel ranks")
    zero_stage: int = _f(0, "ZeRO: 0 = DDP, 1 = shard optimizer, 2 = + gradients, 3 = + parameters")
    bucket_cap_mb: float = _f(25.0, "gradient bucket size in MiB for overlapped all-reduce")
    overlap: bool = _f(True, "start each bucket's communication while backward still runs")
    timeout_s: float = _f(30.0, "seconds a rank waits on a peer before the run fails")
    algorithm: str = _f("ring", f"all-reduce algorithm: {choices_doc(ALGORITHMS)} (mpi-native: MPI's own, "
                        "backend mpi)")
    prefetch: bool = _f(True, "ZeRO-3: gather the next block's parameters ahead of use")
    ranks_per_node: int = _f(0, "ranks per node: the node grid of hierarchical collectives, hybrid sharding "
                             "and network emulation; 0 = every rank on one node")
    threads_per_rank: int = _f(0, "BLAS/OpenMP threads of each rank; 0 = auto: the cores this process may "
                               "use divided by the ranks on its host")


@dataclass(frozen=True)
class EmulateConfig:
    latency_us: float = _f(0.0, "emulated latency added to every message on a link, in microseconds; "
                           "0 = none (backends processes and tcp)")
    bandwidth_gbps: float = _f(0.0, "emulated bandwidth cap per link, in Gbit/s; 0 = uncapped")
    inter_latency_us: float = _f(0.0, "latency between virtual nodes of parallel.ranks_per_node ranks; "
                                 "0 = as within a node")
    inter_bandwidth_gbps: float = _f(0.0, "bandwidth cap between virtual nodes, in Gbit/s; "
                                     "0 = as within a node")


@dataclass(frozen=True)
class PrecisionConfig:
    dtype: str = _f("fp32", f"{choices_doc(DTYPES)} for parameters and activations")
    loss_scale: str | float = _f("dynamic", '"dynamic" or a fixed number (static); used by fp16 only')
    init_scale: float = _f(65536.0, "first dynamic loss scale (2^16)")
    growth_factor: float = _f(2.0, "multiply the scale by this after growth_interval clean steps")
    backoff_factor: float = _f(0.5, "multiply the scale by this on overflow")
    growth_interval: int = _f(2000, "clean steps before the scale grows")
    hysteresis: int = _f(1, "overflows tolerated before the scale backs off")
    min_scale: float = _f(0.0, "abort when the scale would drop below this; 0 = never")


@dataclass(frozen=True)
class MemoryConfig:
    checkpointing: str = _f("none", f"{choices_doc(CHECKPOINTING)}: recompute no block, every block, or "
                            "every K-th")


@dataclass(frozen=True)
class CheckpointConfig:
    every: int = _f(0, "steps between checkpoints; 0 = only at the end")
    keep: int = _f(3, "most recent checkpoints kept on disk")


@dataclass(frozen=True)
class RunConfig:
    out_dir: str = _f("runs", "folder that receives one sub-folder per run")
    check_memory: bool = _f(True, "refuse to start when the estimated peak memory of this machine's ranks "
                            "exceeds its available memory")


@dataclass(frozen=True)
class LogConfig:
    to: tuple[str, ...] = _f((), f"telemetry sinks besides the run folder, any of {choices_doc(SINKS)}")
    project: str = _f("nanodist", "the W&B project and the MLflow experiment runs are logged under")
    mlflow_uri: str = _f("", 'MLflow tracking URI; "" = a file store in the run folder (RUN_DIR/mlruns)')


@dataclass(frozen=True)
class SearchParam:
    type: str = _f("float", choices_doc(PARAM_TYPES))
    low: float | None = _f(None, "lower bound (float, int)")
    high: float | None = _f(None, "upper bound (float, int)")
    log: bool = _f(False, "sample on a log scale; needs low > 0 (float, int)")
    step: float | None = _f(None, "sample only low, low + step, ... (float, int; int: 1 unless set)")
    choices: tuple | None = _f(None, "values to pick from (categorical)")


@dataclass(frozen=True)
class SweepConfig:
    study: str = _f("", "study name; the sweep's folder is <run.out_dir>/sweep-<study>; empty = the preset's "
                    "name")
    metric: str | tuple[str, ...] = _f("val_loss", f"what a trial scores: {choices_doc(METRICS)}, or a list "
                                       "of them (a multi-objective study: its Pareto front)")
    direction: str | tuple[str, ...] = _f("", f"{choices_doc(DIRECTIONS)}, one per metric; empty = each "
                                          "metric's own (tokens_per_s up, the rest down)")
    n_trials: int = _f(20, "trials the study holds when the sweep ends (a rerun continues up to it); 0 = no "
                       "limit (set timeout_s)")
    timeout_s: float = _f(0.0, "seconds after which no new trial starts; 0 = no limit")
    sampler: str = _f("default", choices_doc(SAMPLERS) + ' (default: Optuna\'s, TPE)')
    pruner: str = _f("none", f"{choices_doc(PRUNERS)}: stops unpromising trials at their evaluations")
    prune_startup_trials: int = _f(5, "trials that must finish before the median pruner stops any")
    prune_warmup_steps: int = _f(0, "steps a trial trains before the median pruner may stop it")
    seed: int = _f(0, "sampler seed: the same seed samples the same sequence")
    memory_budget_mb: float = _f(0.0, "per-rank memory budget in MB (10^6 bytes): a trial estimated above it "
                                 "never trains, one measured above it fails; 0 = none")
    space: dict = field(default_factory=dict, metadata={"doc": "dotted config key -> SearchParam"})


@dataclass(frozen=True)
class Config:
    name: str = _f("unnamed", "preset name, shown in the UI and in run folder names")
    description: str = _f("", "one line on what this preset is for")
    seed: int = _f(0, "seed for initialisation, data order and dropout")
    model: ModelConfig = _section(ModelConfig, "the network")
    data: DataConfig = _section(DataConfig, "what it trains on")
    train: TrainConfig = _section(TrainConfig, "loop lengths and batch sizes")
    optim: OptimConfig = _section(OptimConfig, "AdamW and the learning-rate schedule")
    parallel: ParallelConfig = _section(ParallelConfig, "data parallelism and ZeRO")
    emulate: EmulateConfig = _section(EmulateConfig, "a slower network, emulated on one machine "
                                      "(processes, tcp)")
    precision: PrecisionConfig = _section(PrecisionConfig, "number formats and loss scaling")
    memory: MemoryConfig = _section(MemoryConfig, "activation checkpointing")
    checkpoint: CheckpointConfig = _section(CheckpointConfig, "saving training state")
    run: RunConfig = _section(RunConfig, "where results go")
    log: LogConfig = _section(LogConfig, "TensorBoard, W&B and MLflow")
    sweep: SweepConfig | None = _f(None, "optional Optuna search")


_SECTIONS: dict[str, type] = {
    f.name: t for f in dataclasses.fields(Config)
    if isinstance(t := typing.get_type_hints(Config)[f.name], type) and dataclasses.is_dataclass(t)
} | {"sweep": SweepConfig}

# dotted key -> (type hint, dataclass field) for every scalar setting (sweep.space aside)
_FIELDS: dict[str, tuple[Any, dataclasses.Field]] = {}
for _cls, _prefix in [(Config, "")] + [(c, n + ".") for n, c in _SECTIONS.items()]:
    _hints = typing.get_type_hints(_cls)
    for _fld in dataclasses.fields(_cls):
        if _fld.name not in _SECTIONS and _fld.name != "space":
            _FIELDS[_prefix + _fld.name] = (_hints[_fld.name], _fld)


def setting_keys() -> list[str]:
    """Every dotted setting name (sweep.space entries aside), in definition order."""
    return list(_FIELDS)


def describe(key: str) -> str:
    """The one-line doc of a dotted key, e.g. describe("optim.lr")."""
    if key in _SECTIONS:
        return next(f.metadata["doc"] for f in dataclasses.fields(Config) if f.name == key)
    return _FIELDS[key][1].metadata["doc"]


def field_type(key: str) -> Any:
    """The type hint of a dotted key (int, float, bool, str, ...), or None for an unknown key."""
    return _FIELDS[key][0] if key in _FIELDS else None


def split_key(dotted: str) -> tuple[str, ...]:
    """Path of a dotted key in the dict form; sweep.space entries keep their own dotted name."""
    prefix = "sweep.space."
    if not dotted.startswith(prefix) or dotted == prefix:
        return tuple(dotted.split("."))
    rest = dotted[len(prefix):]
    head, _, attr = rest.rpartition(".")
    if head and attr in {f.name for f in dataclasses.fields(SearchParam)}:
        return ("sweep", "space", head, attr)
    return ("sweep", "space", rest)


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
    """Checks that need the loaded data (engine.config_rules.data_problem); ConfigError names `source`."""
    if problem := data_problem(cfg, n_train_tokens, n_val_tokens, data_vocab):
        raise ConfigError(*problem, source)


# ---- validation internals (the rules themselves: engine.config_rules) ----

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
    default = _FIELDS[key][1].default
    if hint == tuple[str, ...] and isinstance(value, str):
        default = [value]  # one name where a list belongs: the fix is the list of it
    raise ConfigError(key, f"expected {wanted}, got {toml_repr(value)} ({type(value).__name__})",
                      f"write e.g. {key.rpartition('.')[2]} = {toml_repr(default)}")


def _build_fields(cls: type, prefix: str, d: Mapping[str, Any]) -> dict[str, Any]:
    names = [f.name for f in dataclasses.fields(cls) if f.name not in _SECTIONS and f.name != "space"]
    kwargs = {}
    for name, value in d.items():
        key = prefix + name
        if name not in names:
            raise ConfigError(key, "unknown key", did_you_mean(key, list(_FIELDS)))
        kwargs[name] = _coerce(key, value, _FIELDS[key][0])
        if key in RULES and (problem := RULES[key](kwargs[name])):
            raise ConfigError(key, *problem)
    return kwargs


def _build(d: Mapping[str, Any]) -> Config:
    if not isinstance(d, Mapping):
        raise ConfigError("", f"expected a table of settings, got {type(d).__name__}", "pass a TOML document")
    top = {k: v for k, v in d.items() if k not in _SECTIONS}
    for name, value in top.items():
        if isinstance(value, Mapping) and name not in _FIELDS:
            close = difflib.get_close_matches(name, list(_SECTIONS), n=1, cutoff=0.6)
            raise ConfigError(f"[{name}]", "unknown section", f"did you mean [{close[0]}]?" if close
                              else "valid sections: " + ", ".join(_SECTIONS))
    kwargs = _build_fields(Config, "", top)
    for name, cls in _SECTIONS.items():
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
    if key not in _FIELDS or key.startswith("sweep.") or key in ("name", "description"):
        raise ConfigError(name, f"{key} is not a setting a sweep can vary",
                          did_you_mean(key, [k for k in _FIELDS if not k.startswith("sweep.")]))
    if not isinstance(spec, Mapping):
        raise ConfigError(name, f"expected a table, got {toml_repr(spec)}", 'write {type="float", low, high}')
    attrs = [f.name for f in dataclasses.fields(SearchParam)]
    for attr in spec:
        if attr not in attrs:
            raise ConfigError(f"{name}.{attr}", "unknown key", did_you_mean(attr, attrs))
    kind = spec.get("type", "float")
    hint = _FIELDS[key][0]
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
