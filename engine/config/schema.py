"""The configuration's schema: every section and setting of a preset as frozen dataclasses, each field with
its default and one-line doc, the dotted-key tables built from them, and ConfigError.

Pure: no parsing or validation here (engine.config builds a Config from a dict and validates it; the
rules themselves are engine.config.rules).
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any

from engine.comm.collectives import ALGORITHMS
from engine.comm.launch import BACKENDS
from engine.config.vocabulary import (
    CONTEXT_LAYOUTS,
    DIRECTIONS,
    METRICS,
    PARAM_TYPES,
    PIPELINE_SCHEDULES,
    PRUNERS,
    SAMPLERS,
    SINKS,
    STAGE_BALANCES,
)
from engine.config.wording import choices_doc
from engine.data import DATA_KINDS
from engine.dtypes import DTYPES
from engine.nn import MODEL_KINDS
from engine.optim import SCHEDULES
from engine.parallel.mesh import AXES, DEFAULT_ORDER
from engine.recompute import CHECKPOINTING


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
    default with another kind, it is an error (engine.config.rules.unread_setting_problem)."""
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
    n_experts: int = _f(0, "mixture of experts: expert MLPs in each MoE block; 0 = dense", only=("gpt",))
    top_k: int = _f(2, "experts each token is routed to, 1 <= top_k <= n_experts", only=("gpt",))
    moe_every: int = _f(1, "blocks 0, moe_every, 2 x moe_every, ... are MoE (1 = every block, 2 = every "
                        "other)", only=("gpt",))
    capacity_factor: float = _f(0.0, "tokens an expert takes, as a multiple of an even share (N x top_k / "
                                "n_experts); later tokens are dropped; 0 = dropless", only=("gpt",))
    aux_loss_coef: float = _f(0.01, "weight of the load-balancing loss (Switch): n_experts x sum f_i P_i",
                              only=("gpt",))


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
    world_size: int = _f(1, "ranks in all: data x tensor x pipeline x context (data: what remains)")
    tensor: int = _f(1, "tensor-parallel degree: ranks splitting each layer's weight matrices; must divide "
                     "model.n_head")
    pipeline: int = _f(1, "pipeline-parallel degree: stages, each a run of consecutive blocks")
    schedule: str = _f("1f1b", "pipeline schedule (pipeline > 1): " + "; ".join(
        f'"{k}" ({what})' for k, what in PIPELINE_SCHEDULES.items()))
    chunks: int = _f(1, 'model chunks (virtual stages) per pipeline rank: schedule "interleaved" only, >= 2')
    stage_balance: str = _f("params", "how the blocks are cut into pipeline stages: "
                            f"{choices_doc(STAGE_BALANCES)} (parameter count, or measured forward time)")
    pipeline_emulate_ms: float = _f(0.0, "pipeline > 1: each forward and each backward half sleeps this "
                                    "long instead of computing, so schedules of many stages are timed on few "
                                    "cores (nothing trains: the gradients are zero); 0 = real compute")
    context: int = _f(1, "context-parallel degree: ranks splitting each sequence (ring attention)")
    context_layout: str = _f("zigzag", "context > 1: which chunks of a sequence each rank holds: "
                             + "; ".join(f'"{k}" ({what})' for k, what in CONTEXT_LAYOUTS.items()))
    expert: int = _f(1, "expert-parallel degree: ranks splitting the experts; carved out of the data x "
                     "context ranks (it must divide them), so it does not multiply world_size")
    order: str = _f(DEFAULT_ORDER, "the mesh's axes, innermost (adjacent ranks) first, joined by \"-\": "
                    + ", ".join(f"{a} ({key})" for a, key in AXES.items()) + " each once")
    sequence_parallel: bool = _f(False, "with tensor > 1: layer norm and dropout hold 1/tensor of the "
                                 "sequence (all-gather and reduce-scatter instead of all-reduce)")
    zero_stage: int = _f(0, "ZeRO: 0 = DDP, 1 = shard optimizer, 2 = + gradients, 3 = + parameters")
    bucket_cap_mb: float = _f(25.0, "gradient bucket size in MiB for overlapped all-reduce")
    overlap: bool = _f(True, "start each bucket's communication while backward still runs")
    timeout_s: float = _f(30.0, "seconds a rank waits on a peer before the run fails")
    algorithm: str = _f("ring", f"all-reduce of DDP's buckets (stage 0) and of hybrid sharding's inter-node "
                        f"step: {choices_doc(ALGORITHMS)} (hierarchical needs ranks_per_node; auto picks by "
                        "message size from measured crossovers; mpi-native: MPI's own, backend mpi)")
    prefetch: bool = _f(True, "ZeRO-3: gather the next block's parameters ahead of use")
    ranks_per_node: int = _f(0, "ranks per node: the node grid of hierarchical collectives, hybrid sharding "
                             "and network emulation; 0 = every rank on one node")
    hybrid: bool = _f(False, "ZeRO 1-3 shard inside each node (ranks_per_node ranks) and replicate across "
                      "nodes; gradients reduced hierarchically")
    tuning_file: str = _f("", 'measured crossovers for algorithm "auto" (bench allreduce --calibrate writes '
                          "them); empty = ~/.cache/nanodist/allreduce-tuning.json")
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
    parallel: ParallelConfig = _section(ParallelConfig, "the device mesh, data parallelism and ZeRO")
    emulate: EmulateConfig = _section(EmulateConfig, "a slower network, emulated on one machine "
                                      "(processes, tcp)")
    precision: PrecisionConfig = _section(PrecisionConfig, "number formats and loss scaling")
    memory: MemoryConfig = _section(MemoryConfig, "activation checkpointing")
    checkpoint: CheckpointConfig = _section(CheckpointConfig, "saving training state")
    run: RunConfig = _section(RunConfig, "where results go")
    log: LogConfig = _section(LogConfig, "TensorBoard, W&B and MLflow")
    sweep: SweepConfig | None = _f(None, "optional Optuna search")


SECTIONS: dict[str, type] = {
    f.name: t for f in dataclasses.fields(Config)
    if isinstance(t := typing.get_type_hints(Config)[f.name], type) and dataclasses.is_dataclass(t)
} | {"sweep": SweepConfig}

# dotted key -> (type hint, dataclass field) for every scalar setting (sweep.space aside)
FIELDS: dict[str, tuple[Any, dataclasses.Field]] = {}
for _cls, _prefix in [(Config, "")] + [(c, n + ".") for n, c in SECTIONS.items()]:
    _hints = typing.get_type_hints(_cls)
    for _fld in dataclasses.fields(_cls):
        if _fld.name not in SECTIONS and _fld.name != "space":
            FIELDS[_prefix + _fld.name] = (_hints[_fld.name], _fld)


def setting_keys() -> list[str]:
    """Every dotted setting name (sweep.space entries aside), in definition order."""
    return list(FIELDS)


def describe(key: str) -> str:
    """The one-line doc of a dotted key, e.g. describe("optim.lr")."""
    if key in SECTIONS:
        return next(f.metadata["doc"] for f in dataclasses.fields(Config) if f.name == key)
    return FIELDS[key][1].metadata["doc"]


def field_type(key: str) -> Any:
    """The type hint of a dotted key (int, float, bool, str, ...), or None for an unknown key."""
    return FIELDS[key][0] if key in FIELDS else None


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
