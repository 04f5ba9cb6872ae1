"""What a valid configuration is: the rule for each setting, the rules across settings, the checks
against the loaded data. The layout's rules (engine.config.rules_layout), context parallelism's and the
experts' (rules_context, rules_moe) live beside it; their messages' wording in engine.config.wording.

Pure: a rule takes values and returns None, or the problem and the fix it suggests (with the key, for
rules across settings); engine.config turns that into a ConfigError naming the source.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from engine.comm.collectives import ALGORITHMS, ON_ANY_GROUP
from engine.comm.emulation import EMULATION_KEYS
from engine.comm.launch import BACKENDS, EMULATING_BACKENDS
from engine.config.rules_context import CONTEXT_RULES, context_problem
from engine.config.rules_layout import (
    describing,
    mesh_problem,
    pipeline_problem,
    tensor_problem,
    unimplemented_problem,
)
from engine.config.rules_moe import MOE_RULES, moe_problem
from engine.config.vocabulary import (
    DIRECTIONS,
    METRICS,
    PIPELINE_SCHEDULES,
    PRUNERS,
    SAMPLERS,
    SINKS,
    STAGE_BALANCES,
    directions_of,
    metrics_of,
)
from engine.config.wording import KeyedProblem, Problem, choices_doc, toml_repr
from engine.data import DATA_KINDS
from engine.dtypes import DTYPES
from engine.nn import MODEL_KINDS
from engine.optim import SCHEDULES
from engine.parallel.data import ZERO_STAGES
from engine.parallel.mesh import AXES, DEFAULT_ORDER, Mesh, parse_order
from engine.recompute import CHECKPOINTING, checkpointed_blocks

if TYPE_CHECKING:
    from engine.config.schema import Config, SweepConfig

INT64 = 1 << 63  # whole numbers must fit an int64: numpy holds them so in every rank
MAX_TIMEOUT_S = 1e6  # about 11.6 days; waits far past it overflow the clock's arithmetic


def one_of(*choices: str):
    """Rule: the value is one of `choices` (a close one is suggested)."""
    def check(v):
        if v in choices:
            return None
        close = difflib.get_close_matches(str(v), choices, n=1, cutoff=0.5)
        hint = f' (did you mean "{close[0]}"?)' if close else ""
        return f"{toml_repr(v)} is not allowed", "use one of " + ", ".join(f'"{c}"' for c in choices) + hint
    return check


def _between(lo: float, hi: float, open_lo: bool = False, open_hi: bool = False):
    """Rule: a finite number in the range, each end closed unless `open_*`."""
    def check(v):
        if math.isfinite(v) and (v > lo if open_lo else v >= lo) and (v < hi if open_hi else v <= hi):
            return None
        lo_s = f"{'>' if open_lo else '>='} {lo:g}"
        hi_s = f" and {'<' if open_hi else '<='} {hi:g}" if math.isfinite(hi) else ""
        return f"{toml_repr(v)} is out of range", f"use a value {lo_s}{hi_s}"
    return check


def _at_least(n: float):
    return _between(n, math.inf)


_positive = _between(0, math.inf, open_lo=True)


def _widths(v):
    if len(v) >= 2 and min(v) >= 1:
        return None
    return f"{toml_repr(v)} is not a network", "list inputs, hidden widths, classes, each >= 1: [784, 64, 10]"


def _checkpointing(v):
    try:
        checkpointed_blocks(v, 1)
        return None
    except ValueError:
        fix = f'use {choices_doc(CHECKPOINTING)} with K >= 1, e.g. "every:2"'
        return f"{toml_repr(v)} is not allowed", fix


def _folder_name(v):
    if v == "" or re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", v):
        return None
    return f"{toml_repr(v)} cannot name a folder", "use letters, digits, '.', '_' and '-' (e.g. lr-search)"


def _non_empty(what: str, example: str):
    def check(v):
        return None if v.strip() else ("is empty", f"give {what}, e.g. {toml_repr(example)}")
    return check


def _order(v):
    try:
        parse_order(v)
        return None
    except ValueError as e:
        fix = f'name {", ".join(AXES)} once each, innermost first, e.g. "{DEFAULT_ORDER}"'
        return f"{toml_repr(v)} is not an axis order: {e}", fix


def _sinks(v):
    """Rule for log.to: known sink names, each once."""
    for name in v:
        if problem := one_of(*SINKS)(name):
            return problem
    if twice := sorted({name for name in v if v.count(name) > 1}):
        return f"{toml_repr(twice[0])} is named twice", "name each sink once"
    return None


# dotted key -> rule; a rule returns None for a good value, else (problem, fix)
RULES: dict[str, Callable[[Any], Problem | None]] = {
    "seed": _at_least(0),
    "model.kind": one_of(*MODEL_KINDS), "model.n_layer": _at_least(1), "model.n_head": _at_least(1),
    "model.n_embd": _at_least(1), "model.block_size": _at_least(1), "model.vocab_size": _at_least(0),
    "model.dropout": _between(0, 1, open_hi=True), "model.widths": _widths,
    "data.kind": one_of(*DATA_KINDS),
    "data.max_chars": _at_least(0), "data.val_fraction": _between(0, 0.5, open_lo=True),
    "data.n_samples": _at_least(2),
    "train.steps": _at_least(1), "train.global_batch": _at_least(1), "train.micro_batches": _at_least(1),
    "train.eval_every": _at_least(0), "train.eval_batches": _at_least(1), "train.log_every": _at_least(1),
    "optim.lr": _positive, "optim.min_lr": _at_least(0), "optim.schedule": one_of(*SCHEDULES),
    "optim.warmup_steps": _at_least(0), "optim.weight_decay": _at_least(0),
    "optim.beta1": _between(0, 1, open_hi=True), "optim.beta2": _between(0, 1, open_hi=True),
    "optim.eps": _positive, "optim.grad_clip": _at_least(0),
    "parallel.backend": one_of(*BACKENDS),
    "parallel.world_size": _between(1, 1024),
    **{f"parallel.{key}": _between(1, 1024) for axis, key in AXES.items() if axis != "dp"},
    "parallel.order": _order, **CONTEXT_RULES,
    "parallel.schedule": one_of(*PIPELINE_SCHEDULES), "parallel.chunks": _between(1, 64),
    "parallel.stage_balance": one_of(*STAGE_BALANCES), "parallel.pipeline_emulate_ms": _at_least(0),
    "parallel.zero_stage": _between(min(ZERO_STAGES), max(ZERO_STAGES)),
    "parallel.bucket_cap_mb": _positive,
    "parallel.timeout_s": _between(0, MAX_TIMEOUT_S, open_lo=True),
    "parallel.algorithm": one_of(*ALGORITHMS), "parallel.ranks_per_node": _at_least(0),
    **{f"emulate.{key}": _at_least(0) for key in EMULATION_KEYS},
    "parallel.threads_per_rank": _between(0, 4096),
    "precision.dtype": one_of(*DTYPES),
    "precision.loss_scale": lambda v: one_of("dynamic")(v) if isinstance(v, str) else _positive(v),
    "precision.init_scale": _positive, "precision.growth_factor": _between(1, math.inf, open_lo=True),
    "precision.backoff_factor": _between(0, 1, open_lo=True, open_hi=True),
    "precision.growth_interval": _at_least(1), "precision.hysteresis": _at_least(1),
    "precision.min_scale": _at_least(0),
    "memory.checkpointing": _checkpointing,
    "checkpoint.every": _at_least(0), "checkpoint.keep": _at_least(1),
    "run.out_dir": _non_empty("a folder", "runs"),
    "log.to": _sinks, "log.project": _non_empty("a name", "nanodist"),
    "sweep.study": _folder_name,
    "sweep.metric": lambda v: _names(v, METRICS, "metric"),
    "sweep.direction": lambda v: None if v == "" else _names(v, DIRECTIONS, "direction", repeat=True),
    "sweep.n_trials": _at_least(0), "sweep.timeout_s": _at_least(0),
    "sweep.sampler": one_of(*SAMPLERS), "sweep.pruner": one_of(*PRUNERS),
    "sweep.seed": _at_least(0), "sweep.memory_budget_mb": _at_least(0),
    "sweep.prune_startup_trials": _at_least(0), "sweep.prune_warmup_steps": _at_least(0),
    **MOE_RULES,
}


def _names(value: Any, choices: Iterable[str], what: str, repeat: bool = False) -> Problem | None:
    """Rule: a name, or a non-empty list of names, each one of `choices` (distinct unless `repeat`)."""
    names = [value] if isinstance(value, str) else list(value)
    if not names:
        return "is an empty list", f"name at least one {what}: {choices_doc(choices)}"
    if not repeat and len(set(names)) != len(names):
        return f"{toml_repr(names)} names a {what} twice", "list each once"
    return next((p for p in map(one_of(*choices), names) if p is not None), None)


def sweep_problem(sweep: SweepConfig) -> KeyedProblem | None:
    """The first rule across [sweep] keys that `sweep` breaks, as (key, problem, fix), or None."""
    metrics = metrics_of(sweep)
    if len(directions_of(sweep)) != len(metrics):
        return ("sweep.direction", f"{len(directions_of(sweep))} direction(s) for {len(metrics)} metric(s)",
                "give one direction per metric, or none (each metric's own)")
    if not sweep.n_trials and not sweep.timeout_s:
        return ("sweep.n_trials", "0 (no limit) with no timeout_s: the sweep would never end",
                "set n_trials = 20 or timeout_s = 3600")
    if len(metrics) > 1 and sweep.pruner != "none":
        return ("sweep.pruner", f"{toml_repr(sweep.pruner)} needs a single metric: Optuna cannot prune a "
                f"trial scored on {len(metrics)}", 'set pruner = "none"')
    if len(metrics) > 1 and sweep.sampler == "cmaes":
        return ("sweep.sampler", f"CMA-ES optimizes one metric, not {len(metrics)}",
                'use "nsga2", "tpe" or "random"')
    if sweep.sampler == "grid":
        for key, param in sweep.space.items():
            if param.type == "float" and param.step is None:
                return (f"sweep.space.{key}.step", 'the "grid" sampler needs a finite set of values',
                        "give this float a step, or make it categorical")
    return None

def combination_problem(cfg: Config) -> KeyedProblem | None:
    """The first rule across settings that cfg breaks, as (key, problem, fix), or None."""
    m, t, o, p, pr = cfg.model, cfg.train, cfg.optim, cfg.parallel, cfg.precision
    if problem := (unimplemented_problem(p) or mesh_problem(cfg) or tensor_problem(cfg)
                   or pipeline_problem(cfg) or moe_problem(cfg, describing())):
        return problem
    if problem := context_problem(cfg):
        return problem
    dp = Mesh.of(p).dp
    split = dp * t.micro_batches
    over = f"world_size {p.world_size}" if dp == p.world_size else f"the data-parallel degree {dp}"
    if t.global_batch % split:
        return ("train.global_batch", f"{t.global_batch} cannot be split evenly over {over} "
                f"x micro_batches {t.micro_batches} = {split}",
                f"use a multiple of {split}, e.g. {max(split, t.global_batch // split * split)}")
    if m.kind == "gpt" and m.n_embd % m.n_head:
        divisors = [h for h in range(1, m.n_embd + 1) if m.n_embd % h == 0]
        near = sorted(divisors, key=lambda h: abs(h - m.n_head))
        return ("model.n_head", f"{m.n_head} heads do not divide n_embd {m.n_embd}",
                f"use a divisor of {m.n_embd} such as {sorted(near[:2])}, or change model.n_embd")
    if not isinstance(pr.loss_scale, str) and pr.dtype != "fp16":
        return ("precision.loss_scale", f"a static loss scale only applies to fp16, not {pr.dtype}",
                'remove it (or use "dynamic", inert outside fp16) or set precision.dtype = "fp16"')
    task = MODEL_KINDS[m.kind][0]
    if DATA_KINDS[cfg.data.kind] != task:
        fits = [k for k, t in DATA_KINDS.items() if t == task]
        others = [k for k, (t, _) in MODEL_KINDS.items() if t == DATA_KINDS[cfg.data.kind]]
        what = {"lm": "language-model", "classification": "classification"}[task]
        return ("data.kind", f'the {m.kind} model needs {what} data, got "{cfg.data.kind}"',
                f"set data.kind = {' or '.join(map(toml_repr, fits))}"
                + (f" or model.kind = {toml_repr(others[0])}" if others else ""))
    if problem := unread_setting_problem(cfg):
        return problem
    if m.kind == "mlp" and cfg.memory.checkpointing != "none":
        return ("memory.checkpointing", "activation checkpointing works per transformer block, "
                "the mlp model has none", 'set memory.checkpointing = "none"')
    if cfg.data.kind == "text" and not cfg.data.path:
        return ("data.path", 'kind = "text" needs a file to read', 'set data.path = "corpus.txt"')
    if o.min_lr > o.lr:
        return ("optim.min_lr", f"{o.min_lr:g} is above optim.lr {o.lr:g}", "use at most optim.lr")
    if p.ranks_per_node and p.world_size % p.ranks_per_node:
        return ("parallel.ranks_per_node", f"{p.ranks_per_node} does not divide world_size {p.world_size}",
                "use a divisor of parallel.world_size (or 0: every rank on one node)")
    if problem := _collective_problem(p):
        return problem
    if problem := emulation_problem(cfg):
        return problem
    if p.algorithm == "mpi-native" and p.backend != "mpi":
        return ("parallel.algorithm", f'"mpi-native" needs backend "mpi", got "{p.backend}"',
                'set parallel.algorithm = "ring" or parallel.backend = "mpi"')
    if pr.min_scale > pr.init_scale:
        return ("precision.min_scale", f"{pr.min_scale:g} is above init_scale {pr.init_scale:g}",
                "lower min_scale (0 = never abort)")
    return None


def _collective_problem(p) -> KeyedProblem | None:
    """The all-reduce algorithm and hybrid sharding against the node grid and the ZeRO stage."""
    if p.algorithm == "hierarchical" and not p.ranks_per_node:
        return ("parallel.algorithm", '"hierarchical" needs a node grid',
                "set parallel.ranks_per_node (ranks on each node, a divisor of world_size)")
    if p.hybrid and p.zero_stage == 0:
        return ("parallel.hybrid", "shards ZeRO state inside a node, but zero_stage 0 shards nothing",
                'set parallel.zero_stage to 1, 2 or 3 (or, for DDP, parallel.algorithm = "hierarchical")')
    if p.hybrid and not p.ranks_per_node:
        return ("parallel.hybrid", "needs a node grid to shard inside",
                "set parallel.ranks_per_node (ranks on each node, a divisor of world_size)")
    if p.hybrid and p.algorithm not in ON_ANY_GROUP:
        return ("parallel.algorithm", f"{toml_repr(p.algorithm)} cannot run hybrid sharding's inter-node "
                "step (a group of one rank per node)",
                f"use one of {', '.join(map(toml_repr, ON_ANY_GROUP))}")
    if p.zero_stage and not p.hybrid and p.algorithm != "ring":
        return ("parallel.algorithm", f"set to {toml_repr(p.algorithm)}, but ZeRO stages 1-3 reduce-scatter "
                "and all-gather on the ring: no all-reduce reads it",
                'remove it, or set parallel.hybrid = true to reduce gradients across nodes with it')
    return None


def emulation_problem(cfg: Config) -> KeyedProblem | None:
    """[emulate] works where the socket transport paces sends, and inter-node figures need nodes."""
    e, p = cfg.emulate, cfg.parallel
    set_keys = [k for k in EMULATION_KEYS if getattr(e, k)]
    if set_keys and p.backend not in EMULATING_BACKENDS:
        return (f"emulate.{set_keys[0]}", "network emulation lives in the socket transport, not the "
                f"{toml_repr(p.backend)} backend",
                f"set parallel.backend = {toml_repr(EMULATING_BACKENDS[0])} "
                "(or remove the [emulate] settings)")
    inter = [k for k in set_keys if k.startswith("inter_")]
    if inter and not (0 < p.ranks_per_node < p.world_size):
        return (f"emulate.{inter[0]}", "a link between virtual nodes needs more than one node, but "
                f"parallel.ranks_per_node = {p.ranks_per_node} with world_size {p.world_size} makes one",
                "set parallel.ranks_per_node to a divisor of world_size below it (e.g. 2 of 4)")
    return None


def unread_setting_problem(cfg: Config) -> KeyedProblem | None:
    """A [model] or [data] setting that the chosen model.kind / data.kind does not read, set to anything
    but its default: it would be silently ignored, so it is an error naming the kind that reads it."""
    for section, kind in (("model", cfg.model.kind), ("data", cfg.data.kind)):
        part = getattr(cfg, section)
        for f in dataclasses.fields(part):
            only = f.metadata.get("only", ())
            if only and kind not in only and getattr(part, f.name) != f.default:
                readers = " or ".join(map(toml_repr, only))
                return (f"{section}.{f.name}", f"set to {toml_repr(getattr(part, f.name))}, but "
                        f"{section}.kind = {toml_repr(kind)} does not read it (only {readers} does)",
                        f"remove it, or set {section}.kind = {toml_repr(only[0])}")
    return None


def data_problem(cfg: Config, n_train_tokens: int, n_val_tokens: int | None,
                 data_vocab: int | None) -> KeyedProblem | None:
    """What needs the loaded data: context vs. corpus length, model vocab vs. corpus characters; the first
    problem as (key, problem, fix), or None."""
    if cfg.model.kind != "gpt":
        return None
    need = cfg.model.block_size + 1  # one context plus the next-token target
    for split, n in (("training", n_train_tokens), ("validation", n_val_tokens)):
        if n is not None and n < need:
            return ("model.block_size", f"context of {cfg.model.block_size} tokens is longer than "
                    f"the {split} data ({n} tokens)",
                    f"lower model.block_size to {max(n - 1, 1)} or less, or use more data")
    if data_vocab is not None and 0 < cfg.model.vocab_size < data_vocab:
        return ("model.vocab_size", f"{cfg.model.vocab_size} is smaller than the corpus's "
                f"{data_vocab} distinct tokens", f"set 0 (from the data) or at least {data_vocab}")
    return None
