"""The allowed values config owns, written down once: what a [sweep] section may say (the metrics a trial
can be scored on, the directions, samplers, pruners, parameter types, and the outcomes a trial can have)
and the telemetry sinks `log.to` may name, and which axes of the device mesh (engine.parallel.mesh.AXES)
this release can train on.

Pure data (no Optuna, no sink library): engine.config.rules validates against these, the field docs in
engine.config.schema list them, the sweep runner builds its sampler and pruner from them and engine.sinks
its sinks.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.config import SweepConfig

# The telemetry sinks besides the run folder; each comes with the extra of its name
# (`pip install 'nanodist[tensorboard]'`) and lives in engine/sinks/<name>_sink.py.
SINKS = ("tensorboard", "wandb", "mlflow")

# metric -> (what it measures, the direction a study takes when the preset names none)
METRICS: dict[str, tuple[str, str]] = {
    "val_loss": ("validation loss at the trial's end", "minimize"),
    "best_val_loss": ("lowest validation loss of any evaluation", "minimize"),
    "loss": ("training loss, mean of the trial's last 10 steps", "minimize"),
    "tokens_per_s": ("training throughput (tokens or samples per second)", "maximize"),
    "peak_memory_mb": ("highest measured memory of any rank, MB (10^6 bytes)", "minimize"),
    "bytes_per_step": ("bytes a rank sends per step (the busiest rank, mean over steps)", "minimize"),
}
DIRECTIONS = ("minimize", "maximize")
# sampler -> what it is; "default" leaves the choice to Optuna (TPE)
SAMPLERS: dict[str, str] = {
    "default": "Optuna's default (TPE)", "tpe": "tree-structured Parzen estimator",
    "random": "uniform random",
    "grid": "every combination of the space's values", "cmaes": "CMA-ES (one metric, numeric parameters)",
    "nsga2": "NSGA-II genetic search (suits several metrics)",
}
PRUNERS: dict[str, str] = {
    "none": "every trial trains to its end", "median": "stop a trial worse than the median of earlier "
    "trials at the same step", "successive-halving": "keep the best part of the trials at each rung",
    "hyperband": "successive halving over several budgets",
}
PARAM_TYPES = ("float", "int", "categorical")
# The mesh axes a training run may give a degree above 1 (engine.parallel.mesh.AXES names them all):
# any other is refused in one line (engine.config.rules) until its parallelism is built; the mesh command,
# which only describes a layout, takes every degree. Add an axis here when the trainer runs it.
IMPLEMENTED_AXES = frozenset({"dp", "tp", "pp", "cp", "ep"})
# Pipeline schedules (engine.parallel.pipeline.schedules builds each): name -> what it is.
PIPELINE_SCHEDULES: dict[str, str] = {
    "gpipe": "all forwards, then all backwards: every micro-batch's activations held at once",
    "1f1b": "one forward, one backward: at most (stages - rank) micro-batches in flight",
    "interleaved": "1F1B over several model chunks per rank: a smaller bubble for more messages",
    "zb-h1": "zero-bubble H1: backward split into input and weight gradients, the weights filling the bubble",
}
# How a context-parallel group holds each sequence (engine.parallel.context.layout): name -> what it is.
CONTEXT_LAYOUTS: dict[str, str] = {
    "zigzag": "rank r holds chunks r and 2c-1-r of 2c: causal attention's work is the same on every rank",
    "contiguous": "rank r holds chunk r of c: the last rank computes c times the first's causal work",
}
# How stages are cut from the blocks: by parameter count, or by forward time measured on this machine.
STAGE_BALANCES = ("params", "time")
# How a trial ended, as the tables, trials.csv and the events name it. "rejected": the estimated
# memory did not fit the budget, so it never trained (Optuna records it as failed).
OUTCOMES = ("complete", "pruned", "failed", "rejected", "running")


def metrics_of(sweep: SweepConfig) -> tuple[str, ...]:
    """The metric names of a sweep, one or several."""
    return (sweep.metric,) if isinstance(sweep.metric, str) else tuple(sweep.metric)


def directions_of(sweep: SweepConfig) -> tuple[str, ...]:
    """One direction per metric: the preset's, or each metric's own."""
    if not sweep.direction:
        return tuple(METRICS[m][1] for m in metrics_of(sweep))
    return (sweep.direction,) if isinstance(sweep.direction, str) else tuple(sweep.direction)
