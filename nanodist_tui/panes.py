"""The one list of the workbench's panes: what each is, when a run has it, where the overview puts it, and
what its help says. A new pane is one more entry in PANES (or `register_pane`); the app builds its tabs and
its overview from this list alone.

Each pane is a widget keeping the Pane protocol (widgets/pane.py), made by `make(info)` for a run of shape
`info`. A pane appears only for runs it `applies` to: the ring, the rank table and the mesh for more than
one rank, the loss scale for fp16, the pipeline for pipeline parallelism.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from textual.widget import Widget

from nanodist_tui.run_info import RunInfo
from nanodist_tui.widgets.context_pane import ContextPane
from nanodist_tui.widgets.curves_pane import CurvesPane
from nanodist_tui.widgets.expert_pane import ExpertPane
from nanodist_tui.widgets.log_pane import LogPane
from nanodist_tui.widgets.loss_plot import LossPlot
from nanodist_tui.widgets.loss_scale_pane import LossScalePane
from nanodist_tui.widgets.memory_pane import MemoryPane
from nanodist_tui.widgets.mesh_pane import MeshPane
from nanodist_tui.widgets.pipeline_pane import PipelinePane
from nanodist_tui.widgets.rank_table import RankTable
from nanodist_tui.widgets.sweep_pane import SweepPane
from nanodist_tui.widgets.traffic_pane import TrafficPane


def always(_info: RunInfo) -> bool:
    return True


def distributed(info: RunInfo) -> bool:
    return info.distributed


def scales_loss(info: RunInfo) -> bool:
    return info.scales_loss


def pipelined(info: RunInfo) -> bool:
    return info.pipeline > 1


def context_parallel(info: RunInfo) -> bool:
    return info.context > 1


def has_experts(info: RunInfo) -> bool:
    return info.n_experts > 0


def sweeping(info: RunInfo) -> bool:
    return info.sweep


@dataclass(frozen=True)
class PaneSpec:
    id: str
    title: str
    make: Callable[[RunInfo], Widget]
    help: str
    applies: Callable[[RunInfo], bool] = always
    # where the overview shows it (0 top, 1 middle, 2 bottom; None: not there), and a smaller widget for it
    overview_row: int | None = None
    overview_make: Callable[[RunInfo], Widget] | None = None  # default: make
    # "run": a tab, made again for every run (a sweep's next trial too); "session": above the tabs, made once
    # when the workbench starts its job and fed through every run of it (a sweep's trials)
    scope: str = "run"


PANES: list[PaneSpec] = [
    PaneSpec("curves", "curves", CurvesPane,
             "Train loss (every step that updated the parameters) and validation loss (each evaluation) "
             "over steps, then the gradient norm (before clipping) and the learning rate. The step axis "
             "spans the whole run from the start, so the curves grow into a plot that holds still. The "
             "overview shows the loss alone.", overview_row=0, overview_make=LossPlot),
    PaneSpec("memory", "memory", MemoryPane,
             "One bar per rank: the bytes the rank holds at the peak of its worst phase (forward, backward "
             "or optimizer step), stacked by category in the legend's colours (letters without colour). "
             "The mark is the run's peak so far. Right of the bar: that peak (MB = 10^6 bytes) and its "
             "phase, then 'est' — the estimator's prediction from the config alone — and how far the "
             "measurement is above (+) or below (-) it. The line under each bar lists every category's "
             "bytes.",
             overview_row=1),
    PaneSpec("traffic", "traffic", TrafficPane,
             "The ranks as a ring: each arrow is a link (rank -> next rank) with the payload bytes it "
             "carried in the last step and its rate (bytes over the time its sends took; GB/s = 10^9 B/s); "
             "a slow link is red. Below: what one rank sent in the step against the ring's bound "
             "k(N-1)/N·S (S = the gradient's bytes; k = 2, or 3 for ZeRO-3), NCCL-tests' algbw (S/t) and "
             "busbw (algbw × 2(N-1)/N for an all-reduce, × (N-1)/N for a reduce-scatter or all-gather) per "
             "phase, and each rank's step split into compute and waiting (blocked on communication), with "
             "the time its sends took; a rank computing much longer than the others is marked as the "
             "straggler they wait for.",
             applies=distributed, overview_row=1),
    PaneSpec("ranks", "ranks", RankTable,
             "One row per rank, updated in place. rank: the rank, and where the mesh has two axes or more "
             "its coordinates under each axis's name (rank dp tp; from three axes on their initials, rank "
             "d p t); step: the last step it reported; step: that step's time; "
             "compute: step time minus waiting; comm: the time its sends took (overlapped with compute "
             "where buckets allow); wait: time blocked until communication finished; wait %: wait over "
             "step time; sent/step: payload bytes it sent in that step; peak mem: its highest total so "
             "far.",
             applies=distributed, overview_row=2),
    PaneSpec("loss-scale", "loss scale", LossScalePane,
             "fp16 only: the loss scale on a log axis over the steps tried (a skipped step does not "
             "advance the step counter, so the axis counts attempts), an x at every overflow (the scale "
             "that overflowed), and below, every scale change: overflow (inf or NaN, the first parameter "
             "that overflowed), hysteresis, growth. The title counts overflows and skipped steps.",
             applies=scales_loss, overview_row=0),
    PaneSpec("log", "log", LogPane,
             "Every discrete event, once, in order: start, evaluations, checkpoints, pauses, scale "
             "changes, the end, and a failure with the rank and its cause.",
             overview_row=2),
    PaneSpec("mesh", "mesh", MeshPane,
             "The device mesh: the ranks on the grid of their parallelism axes (rows: pipeline stage x data "
             "replica; columns: context x tensor rank; only axes of degree > 1, a single axis laid on its "
             "side), rows and columns named by their coordinates, how a rank follows from them under "
             "parallel.order (innermost axis first: adjacent ranks) and where the nodes of "
             "parallel.ranks_per_node ranks fall. Below, every kind of process group with more than one "
             "rank: "
             "ranks (in each group), groups (how many), link (intra-node: each group inside one node; "
             "inter-node: each spans nodes; mixed), per group (what all of one group's ranks sent in the "
             "last step, lowest-highest where the groups differ) and in all (every group of the kind), as "
             "the traffic meter booked them under each group's name (tp0, dpcp1; world, node0 and cross0 "
             "are the meter's own communicators); then what each kind is for ('= dp here': the same ranks "
             "as the dp groups).",
             applies=distributed),
    PaneSpec("pipeline", "pipeline", PipelinePane,
             "Pipeline parallelism's schedule as it ran in the last step every rank of the pipeline "
             "reported: one row per pipeline rank (pp0 at the top; its global rank beside it where they "
             "differ) across the step's wall-clock, each compute action a coloured block from its measured "
             "start to its end, the micro-batch number inside where it fits: F forward, B backward, or "
             "zero-bubble's I (input gradient) and W (weight gradient). A dim line is a communication batch "
             "(sends posted, receives waited for); blank is idle: the bubble. Right of each row its idle "
             "share; below, the step's bubble (idle compute time over ranks x the step's span) beside the "
             "schedule's formula for equal action times: (p-1)/(m+p-1) for gpipe and 1f1b, (p-1)/(v*m+p-1) "
             "interleaved, (p-1)/(3m+p-1) zb-h1. 'emulated compute': each action slept a fixed time. With "
             "data or tensor parallelism there is one pipeline per replica: rank 0's is shown first, and "
             "g shows the next.",
             applies=pipelined),
    PaneSpec("context", "context", ContextPane,
             "Context parallelism's attention work in the latest step every rank reported: per rank the "
             "(query chunk, key chunk) blocks its ring attention computed in the step's training forwards (a "
             "recomputed block's too) and their scores (a diagonal block's whole square), a bar against the "
             "busiest rank, and the busiest over the mean: the step waits for the busiest. Under causal "
             "attention the contiguous layout's busiest rank does 2c/(c+1) of the mean; zigzag balances it "
             "exactly (1.00).",
             applies=context_parallel),
    PaneSpec("experts", "experts", ExpertPane,
             "A mixture of experts' routing in the latest step every rank reported, per MoE layer: the "
             "tokens each expert kept (over all ranks; under expert parallelism the EP rank holding it), "
             "then the rows each rank's experts ran on (what its EP group sent it: its load), max/mean "
             "load over the experts (1.00 is perfect balance), the choices dropped beyond an expert's "
             "capacity, the router's mean entropy per token against its ceiling ln E (every expert equally "
             "likely), and the load-balancing loss.",
             applies=has_experts),
    # A session pane: for the whole of the workbench's job, a sweep's pane follows its trials (x ends it).
    PaneSpec("sweep", "sweep", lambda info: SweepPane(id="sweep"),
             "A sweep's trials, updated in place: number, state (* marks the best), the metrics, steps, time "
             "and the sampled parameters; the best so far, the optimization history, the running trials' "
             "intermediate values and, with two metrics, the Pareto front. The tabs below follow the running "
             "trial.", applies=sweeping, scope="session"),
]


def register_pane(spec: PaneSpec, before: str | None = None) -> None:
    """Add a pane (another module's, e.g. a sweep's) to the workbench, at the end or before pane `before`."""
    index = next((i for i, s in enumerate(PANES) if s.id == before), len(PANES))
    PANES.insert(index, spec)


def panes_for(info: RunInfo, scope: str = "run") -> list[PaneSpec]:
    return [spec for spec in PANES if spec.scope == scope and spec.applies(info)]
