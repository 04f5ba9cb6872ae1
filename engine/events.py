"""The one event stream: typed events, their JSON codec, and the bus that fans them out.

Ranks emit events; the launcher relays them (as `to_json` dicts across processes) to subscribers: the
run recorder, the headless printer, the TUI bridge. Every event class has a class-level `kind`, the tag
written into its JSON form.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

log = logging.getLogger("nanodist.events")


@dataclass(frozen=True)
class RunStarted:
    kind: ClassVar[str] = "run_started"
    run_id: str
    preset: str
    config: dict  # the resolved config as a plain dict (config.to_dict)
    n_params: int
    world_size: int
    total_steps: int
    network: str = ""  # "emulated network: ..." when the links are emulated (engine.comm.emulation)
    threads_per_rank: int = 0  # BLAS/OpenMP threads of each rank (rank 0's host), as resolved; 0 = unknown
    first_step: int = 0  # the step a resumed run starts from
    run_dir: str = ""  # the run folder, when the run is recorded
    # phase -> category -> bytes one rank holds at that phase's peak, as the analytic estimator
    # (engine.memory.estimator) predicts from the config: the same for every rank and step, so the launcher
    # makes it once per run and adds it here; None where no launcher did (a Trainer driven directly).
    # Under pipeline parallelism the ranks' stages differ: this is then the heaviest pipeline rank's, and
    memory_estimate: dict | None = None
    # memory_estimate_per_rank[rank] each rank's own (its pipeline rank's; None without a pipeline)
    memory_estimate_per_rank: list | None = None


@dataclass(frozen=True)
class History:
    """What came before a resumed run: the steps and evaluations of the run it continues (its parent, up to
    the checkpoint it resumed from) and of that run's own ancestors, so curves and the summary's improvement
    cover the whole lineage. The launcher sends it once, right after RunStarted (engine.run.lineage); it is
    recorded with the run, so a replay or a compare of the resumed run draws the whole lineage too."""
    kind: ClassVar[str] = "history"
    parent: str  # the run folder it was resumed from
    step: int  # the step of the checkpoint it was resumed from (its RunStarted.first_step)
    steps: list  # [step, loss, lr, grad_norm] of each step that was not skipped, oldest first
    evals: list  # [step, val_loss] of each evaluation, oldest first (the lineage's first is the start)


@dataclass(frozen=True)
class Phase:
    """What a run is doing before its first step, each stage as it begins: "starting ranks" (the launcher),
    "building the model", "compiling kernels" (the first evaluation: numba compiles the kernels it uses)
    and "first step" (rank 0). A display shows the latest until the steps come; seconds pass between them."""
    kind: ClassVar[str] = "phase"
    name: str


@dataclass(frozen=True)
class StepEnd:
    kind: ClassVar[str] = "step_end"
    step: int
    loss: float
    lr: float
    tokens: int  # tokens (or samples) processed in this step, all ranks; not a running total
    step_time_s: float
    tokens_per_s: float
    grad_norm: float
    loss_scale: float | None = None  # None when loss scaling is off
    skipped: bool = False  # fp16 overflow: the optimizer step was skipped


@dataclass(frozen=True)
class Eval:
    kind: ClassVar[str] = "eval"
    step: int
    val_loss: float


@dataclass(frozen=True)
class RankStats:
    kind: ClassVar[str] = "rank_stats"
    step: int
    rank: int
    step_time_s: float
    comm_wait_s: float
    bytes_sent: int


@dataclass(frozen=True)
class Traffic:
    """What `rank` sent in `step`, one row per link (engine.comm.meter):
        src, dst   global ranks (dst -1: handed to MPI's own Allreduce, wire traffic unknown)
        phase      "reduce-scatter" | "all-gather" | "all-reduce" (hierarchical's inter-node step) |
                   "reduce" | "broadcast" (tree; rhd's fold for non-powers of two) | "param-gather"
                   (ZeRO-3) | "barrier" | "p2p" | "mpi-native"
        group      the communicator: "world", "node<m>" (the ranks of node m), "cross<j>" (local rank j
                   of every node), or another process group's name
        algorithm  what ran: "ring" | "rhd" | "tree" | "hierarchical" (its steps inside the node; its
                   inter-node step shows the algorithm run there) — auto shows the one it chose —
                   | "chain" (broadcast) | "dissemination" (barrier) | "p2p" | "mpi-native"
        bytes, seconds   payload sent, and the time its sends took
    A link whose src and dst sit on different nodes (rank // parallel.ranks_per_node) crossed nodes."""
    kind: ClassVar[str] = "traffic"
    step: int
    rank: int
    links: list  # [{"src", "dst", "phase", "group", "algorithm", "bytes", "seconds"}]


@dataclass(frozen=True)
class MemorySnapshot:
    kind: ClassVar[str] = "memory_snapshot"
    step: int
    rank: int
    phase: str
    current: dict  # category -> bytes held now
    peak: dict  # category -> highest bytes so far
    # The estimator's prediction is the run's, not the step's: RunStarted.memory_estimate[phase].


@dataclass(frozen=True)
class PipelineTimeline:
    """What one pipeline rank did in `step`, action by action, as its executor measured it
    (engine.parallel.pipeline.executor): each row is [op, micro_batch, stage, start_s, end_s] with times in
    seconds from the step's start on that rank; op is an engine.parallel.pipeline.ir.Op value: "F", "B",
    "I", "W", or a communication action ("SEND_ACT", "RECV_ACT", "SEND_GRAD", "RECV_GRAD"), whose rows span
    the time the rank was blocked waiting for the batch they were posted in (none when it had completed
    before it was needed). Idle time between rows is the rank's bubble. `clock_s` is the rank's step start
    (its rows' zero) on the wall clock, seconds since the epoch: the ranks of a pipeline differ in it by
    when each started the step, so a reader puts their rows on one clock by it (0: not known, a recording
    made before it was reported; one host's ranks read the same clock, several hosts' as well as theirs
    agree)."""
    kind: ClassVar[str] = "pipeline_timeline"
    step: int
    rank: int  # global rank
    stage_rank: int  # the rank's place in its pipeline group (stage_rank r holds stages r, r + p, ...)
    schedule: str  # a name from engine.config.vocabulary.PIPELINE_SCHEDULES
    micro_batches: int
    chunks: int
    actions: list  # [[op, micro_batch, stage, start_s, end_s], ...] in the order they ran
    emulated: bool = False  # compute actions slept a fixed time instead of computing
    clock_s: float = 0.0  # the step's start (the rows' zero) on the wall clock; 0: not known


@dataclass(frozen=True)
class ExpertLoad:
    """What one rank's mixture-of-experts layers routed in `step` (engine.moe), summed over the step's
    micro-batches; one entry per MoE layer, in forward order:
        tokens_per_expert  [layer][expert] choices of this rank's tokens that each expert kept
        received           [layer] rows this rank's experts ran on: under expert parallelism what the EP
                           group sent it (its load), else the kept choices of its own tokens
        dropped            [layer] choices beyond an expert's capacity (0 when dropless)
        entropy            [layer] the router's mean entropy per token, nats (mean over micro-batches)
        aux_loss           [layer] the load-balancing loss term (mean over micro-batches)
        blocks             [layer] the block it sits in (a pipeline rank reports its stages' layers only;
                           empty in recordings made before: blocks 0, moe_every, 2·moe_every, ...)"""
    kind: ClassVar[str] = "expert_load"
    step: int
    rank: int
    tokens_per_expert: list
    received: list
    dropped: list
    entropy: list
    aux_loss: list
    blocks: list = field(default_factory=list)


@dataclass(frozen=True)
class ContextWork:
    """What one rank's ring attention computed in the training forwards of `step` (engine.parallel.context; a
    recomputed block's included), under `layout` over `degree` ranks: the (query chunk, key chunk) `blocks`
    and their `scores` (a diagonal block's whole square)."""
    kind: ClassVar[str] = "context_work"
    step: int
    rank: int
    layout: str
    degree: int
    blocks: int
    scores: int


@dataclass(frozen=True)
class LossScaleChange:
    kind: ClassVar[str] = "loss_scale_change"
    step: int
    reason: str  # "inf" | "nan" | "growth" | "hysteresis"
    old_scale: float
    new_scale: float
    first_param: str | None = None  # the first parameter whose gradient overflowed, if any


@dataclass(frozen=True)
class CheckpointSaved:
    kind: ClassVar[str] = "checkpoint_saved"
    step: int
    path: str


@dataclass(frozen=True)
class RunPaused:
    kind: ClassVar[str] = "run_paused"
    step: int  # every rank holds (or goes on) after this step
    paused: bool  # True: held on request; False: training goes on


@dataclass(frozen=True)
class Log:
    kind: ClassVar[str] = "log"
    level: str  # "debug" | "info" | "warning" | "error"
    message: str


@dataclass(frozen=True)
class RunFinished:
    kind: ClassVar[str] = "run_finished"
    steps: int
    initial_val_loss: float | None
    final_val_loss: float | None
    tokens_per_s: float
    wall_s: float
    run_dir: str | None
    stopped: bool = False  # stopped on request before train.steps; its last checkpoint is at `steps`


@dataclass(frozen=True)
class RunFailed:
    kind: ClassVar[str] = "run_failed"
    message: str
    rank: int | None = None  # the rank that failed first, when known


# ---- sweeps (engine.sweep): discrete events around the runs of a sweep's trials

@dataclass(frozen=True)
class SweepStarted:
    kind: ClassVar[str] = "sweep_started"
    study: str
    sweep_dir: str
    storage: str  # where the study lives, as a user would name it (a path or a URL)
    metrics: list
    directions: list
    n_trials: int  # trials the study holds at the end; 0 = no limit
    timeout_s: float  # 0 = no limit
    existing: int  # trials the study already held (a resumed sweep)
    jobs: int


@dataclass(frozen=True)
class TrialStarted:
    kind: ClassVar[str] = "trial_started"
    number: int
    params: dict  # dotted config key -> sampled value
    job: int = 0  # which of the --jobs processes runs it


@dataclass(frozen=True)
class TrialReport:
    kind: ClassVar[str] = "trial_report"
    number: int
    step: int
    value: float  # the metric so far, as the pruner sees it


@dataclass(frozen=True)
class TrialFinished:
    kind: ClassVar[str] = "trial_finished"
    number: int
    state: str  # one of engine.config.vocabulary.OUTCOMES
    metrics: list  # the study's metric names, in the order of `values`
    values: list | None  # one per metric (pruned: the last value reported); None when failed or rejected
    params: dict
    duration_s: float
    steps: int  # optimizer steps it trained
    reason: str = ""  # why it was pruned, failed or rejected
    run_dir: str = ""
    best: list | None = None  # the best trial's number (or the Pareto front's numbers) after this one
    best_values: list | None = None  # the best trial's values (single metric)
    resumed: bool = False  # a trial of an earlier run of this sweep, reported again when it resumes


@dataclass(frozen=True)
class SweepFinished:
    kind: ClassVar[str] = "sweep_finished"
    study: str
    counts: dict  # outcome -> trials of the study
    best: list  # the best trial's number, or the Pareto front's numbers
    stopped: bool  # ended by a stop request before its count or time was spent


EVENT_TYPES: dict[str, type] = {cls.kind: cls for cls in (
    RunStarted, History, Phase, StepEnd, Eval, RankStats, Traffic, MemorySnapshot, PipelineTimeline,
    ExpertLoad, ContextWork, LossScaleChange, CheckpointSaved, RunPaused, Log, RunFinished, RunFailed,
    SweepStarted, TrialStarted, TrialReport, TrialFinished, SweepFinished)}


class EventError(ValueError):
    """A dict that is not a valid event (unknown kind, missing or unexpected fields)."""


def _plain(value: Any) -> Any:
    """JSON-ready copy: numpy scalars/arrays become Python numbers/lists, tuples lists, keys strings."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "tolist"):  # numpy scalar or array, without importing numpy here
        return value.tolist()
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)  # e.g. a Path


def to_json(ev: Any) -> dict:
    """{"kind": ..., field: value, ...} in plain JSON types (NaN/inf floats allowed, as in Python's json)."""
    return {"kind": ev.kind} | {f.name: _plain(getattr(ev, f.name)) for f in dataclasses.fields(ev)}


def from_json(d: dict) -> Any:
    """The event a `to_json` dict describes; EventError names what is wrong."""
    if not isinstance(d, dict):
        raise EventError(f"an event must be a JSON object, got {type(d).__name__}")
    kind = d.get("kind")
    cls = EVENT_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise EventError(f"unknown event kind {kind!r}; known kinds: {', '.join(EVENT_TYPES)}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    extra = sorted(set(d) - set(fields) - {"kind"})
    missing = [n for n, f in fields.items() if n not in d
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if extra or missing:
        raise EventError(f"{kind} event: missing fields {missing}, unexpected fields {extra}")
    for name, (types, wanted) in _field_types(cls).items():
        if name in d and not _is_a(d[name], types):
            raise EventError(f"{kind} event: {name} should be {wanted}, got {d[name]!r:.60}")
    return cls(**{k: v for k, v in d.items() if k != "kind"})


_TYPES: dict[type, dict[str, tuple[tuple[type, ...], str]]] = {}


def _field_types(cls: type) -> dict[str, tuple[tuple[type, ...], str]]:
    """field -> (the JSON types its value may have, their names), from the event class's annotations."""
    if cls not in _TYPES:
        hints = typing.get_type_hints(cls)
        table = {}
        for f in dataclasses.fields(cls):
            args = typing.get_args(hints[f.name]) or (hints[f.name],)
            types = tuple(typing.get_origin(a) or a for a in args)
            table[f.name] = (types, " or ".join("null" if t is type(None) else t.__name__ for t in types))
        _TYPES[cls] = table
    return _TYPES[cls]


def _is_a(value: Any, types: tuple[type, ...]) -> bool:
    """JSON's view of a type: bools are not numbers, whole numbers are floats too."""
    if isinstance(value, bool):
        return bool in types
    if isinstance(value, int) and float in types:
        return True
    return isinstance(value, types)


def as_event(ev: Any) -> Any:
    """Accept either an event or its JSON dict (what the launcher relays from other processes)."""
    return from_json(ev) if isinstance(ev, dict) else ev


class EventBus:
    """Fan-out of events to subscribers.

    Thread-safe: any thread may subscribe, unsubscribe or emit. Deliveries are serialised (one event at a
    time, in emit order), so subscribers need no locking of their own; a subscriber may emit from inside its
    callback. A subscriber that raises is logged and skipped; the others still get the event.
    """

    def __init__(self) -> None:
        self._subscribers: list[tuple[object, Callable[[Any], None]]] = []
        self._lock = threading.Lock()  # guards the subscriber list
        self._delivery = threading.RLock()  # one event at a time; re-entrant for emits from callbacks

    def subscribe(self, fn: Callable[[Any], None]) -> Callable[[], None]:
        """Register fn(event); returns a function that unsubscribes it (safe to call twice)."""
        token = object()
        with self._lock:
            self._subscribers.append((token, fn))

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers = [(t, f) for t, f in self._subscribers if t is not token]
        return unsubscribe

    def emit(self, ev: Any) -> None:
        with self._lock:
            subscribers = [fn for _, fn in self._subscribers]
        with self._delivery:
            for fn in subscribers:
                try:
                    fn(ev)
                except Exception:
                    log.exception("event subscriber %r failed on a %s event", fn, getattr(ev, "kind", ev))
