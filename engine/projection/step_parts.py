"""What the step model is made of and reports, shared by step.py and pipeline_step.py (a pipeline rank's
step, which builds on them): the groups a stage communicates in (GroupPlan: buckets or units, over the
parameters it holds) and the seconds of one step (StepBreakdown).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from engine.dtypes import itemsize
from engine.memory.tensor_parallel import rank_shapes
from engine.parallel.data.buckets import aligned_buckets
from engine.parallel.data.flat import FlatLayout


@dataclass(frozen=True)
class StepBreakdown:
    """Seconds of one step: step = compute + exposed + interference; overlapped is hidden communication."""

    step_s: float
    compute_s: float
    overlapped_s: float
    exposed_s: float  # waits on communication, including imbalance_s
    interference_s: float
    forward_s: float
    backward_s: float
    recompute_s: float
    optimizer_s: float
    comm_s: float  # every collective's time, hidden or not
    imbalance_s: float  # waiting for slower ranks sharing the host
    algorithm: str
    tp_s: float = 0.0  # tensor and sequence parallelism's collectives: all exposed (part of exposed_s)
    tp: dict = field(default_factory=dict)  # TensorParallel.summary(): degree, link, per layer, per step
    bubble_s: float = 0.0  # pipeline: the mean pipeline rank's idle time in the schedule (part of exposed_s)
    p2p_s: float = 0.0  # pipeline: what the stage-to-stage messages add to the schedule
    pp: dict = field(default_factory=dict)  # the pipeline's summary (pipeline_step.py); empty at p = 1
    cp_s: float = 0.0  # context parallelism's ring hops: the part its blocks do not hide (of exposed_s)
    cp: dict = field(default_factory=dict)  # ContextParallel.summary() (context.py); empty at c = 1
    ep_s: float = 0.0  # expert parallelism's all-to-alls: all exposed (part of exposed_s)
    ep: dict = field(default_factory=dict)  # ExpertParallel.summary() (expert.py); empty at e = 1

    @property
    def comm_share(self) -> float:
        """Exposed communication over the step: what the training thread waits on."""
        return self.exposed_s / self.step_s if self.step_s else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self), "comm_share": self.comm_share}


class GroupPlan:
    """The groups a stage communicates in: bucket (stages 0-2) or unit (stage 3) sizes in bytes, and the
    parameter indices each holds. `shapes`: the parameters (a pipeline stage's), by default all of them."""

    def __init__(self, cfg, vocab: int, world: int, shapes: list | None = None):
        shapes = shapes or rank_shapes(cfg, vocab)  # one rank's shard of them under tensor parallelism
        s, stage, cap = itemsize(cfg.precision.dtype), cfg.parallel.zero_stage, cfg.parallel.bucket_cap_mb
        named = [(name, shape) for name, shape, _ in shapes]
        if stage == 0:
            layout = FlatLayout(named, cfg.precision.dtype)
            plan = layout.bucket_plan(int(cap * 2**20))
            self.sizes = [(b - a) * s for a, b, _ in plan]
            self.members = [tuple(members) for _, _, members in plan]
        elif stage in (1, 2):
            buckets = aligned_buckets(FlatLayout(named, cfg.precision.dtype, world), int(cap * 2**20), world)
            self.sizes = [(b.end - b.start) * s for b in buckets]
            self.members = [b.members for b in buckets]
        else:
            units: dict = {}
            for i, (_, _, unit) in enumerate(shapes):
                units.setdefault(unit, []).append(i)
            order = ([None] if None in units else []) + sorted(u for u in units if u is not None)
            self.units = order
            self.members = [tuple(units[u]) for u in order]
            self.sizes = [math.ceil(sum(math.prod(shapes[i][1]) for i in units[u]) / world) * world * s
                          for u in order]
