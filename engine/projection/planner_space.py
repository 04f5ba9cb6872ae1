"""The planner's search space: every layout of N ranks for one model, and the config each one is.

A layout is the degrees of the mesh (data, tensor, pipeline, context, expert: their product with expert
left out is N; expert is carved out of data x context), the axis order, the ZeRO stage, the micro-batches
(and, under pipeline parallelism, the schedule and its chunks), activation checkpointing and the gradient
bucket size. The global batch is the preset's: a layout changes how a step is computed, never what it
computes (the optimiser sees the same batch).

The values tried (a small set per setting; the search is the product):

    degrees         every tensor x pipeline x context x data split of N (expert: every divisor of data x
                    context that divides the experts, for an MoE model)
    order           ORDERS, where the axes they reorder both have a degree above 1 (else the same ranks)
    zero            0-3
    micro-batches   without a pipeline 1, 2, 4; with one the fewest at or above p, 2p and 4p that divide
                    a replica's rows, and one row each; at most MAX_MICRO_BATCHES
    schedule        1f1b, gpipe, zb-h1, interleaved with 2 chunks (a pipeline's only)
    checkpointing   none, every block (a GPT's)
    bucket          BUCKETS_MB, where a replica's gradients make at most MAX_BUCKETS of them

Each candidate is then checked by the config's own rules (engine.config.rules.combination_problem: the
rules a run is checked by), so the planner never proposes what `nanodist-tui run` would refuse; it checks
the layout without the launch limits (world size, degrees up to 1024), as the projection does.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

from engine.config import Config
from engine.config.rules import combination_problem
from engine.config.rules_layout import divisors
from engine.parallel.mesh import DEFAULT_ORDER

ORDERS = (DEFAULT_ORDER, "tp-cp-ep-pp-dp")  # Megatron's; and pipeline stages inside data replicas
SCHEDULES = (("1f1b", 1), ("gpipe", 1), ("zb-h1", 1), ("interleaved", 2))
CHECKPOINTING = ("none", "blocks")
BUCKETS_MB = (25.0, 4.0, 100.0)  # the default first: ties go to it
MAX_MICRO_BATCHES = 64  # a pipeline's schedule is replayed action by action: its cost grows with m, and past
# 4p micro-batches the bubble shrinks little
MAX_BUCKETS = 4096  # more buckets than this a step is not a layout anyone runs (and slow to replay)


@dataclass(frozen=True)
class Layout:
    """One way to lay a model on N ranks."""

    data: int
    tensor: int
    pipeline: int
    context: int
    expert: int
    order: str
    zero: int
    micro_batches: int
    schedule: str
    chunks: int
    checkpointing: str
    bucket_mb: float

    @property
    def degrees(self) -> tuple[int, int, int, int, int]:
        return (self.data, self.tensor, self.pipeline, self.context, self.expert)

    @property
    def shape(self) -> tuple:
        """What sets its compute and bubble: everything but the order, the ZeRO stage and the buckets."""
        return (self.degrees, self.micro_batches, self.schedule, self.chunks, self.checkpointing)

    def label(self) -> str:
        """Short, for tables: "dp 8 tp 2 pp 4 1f1b m16 z1 ckpt 4MB" (degrees of 1 left out, and the bucket
        size where it is the default 25 MB)."""
        parts = [f"{axis} {d}" for axis, d in zip(("dp", "tp", "pp", "cp", "ep"), self.degrees) if d > 1]
        parts = parts or ["1 rank"]
        if self.pipeline > 1:
            parts.append(self.schedule + (f"x{self.chunks}" if self.chunks > 1 else ""))
        parts.append(f"m{self.micro_batches}")
        parts.append(f"z{self.zero}")
        if self.checkpointing != "none":
            parts.append("ckpt")
        if self.bucket_mb != BUCKETS_MB[0]:
            parts.append(f"{self.bucket_mb:g}MB")
        if self.order != DEFAULT_ORDER:
            parts.append(self.order)
        return " ".join(parts)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def overrides(self) -> list[str]:
        """The --set overrides that make a preset this layout (world size aside)."""
        return [f"parallel.tensor={self.tensor}", f"parallel.pipeline={self.pipeline}",
                f"parallel.context={self.context}", f"parallel.expert={self.expert}",
                f'parallel.order="{self.order}"', f"parallel.zero_stage={self.zero}",
                f"train.micro_batches={self.micro_batches}", f'parallel.schedule="{self.schedule}"',
                f"parallel.chunks={self.chunks}", f'memory.checkpointing="{self.checkpointing}"',
                f"parallel.bucket_cap_mb={self.bucket_mb:g}"]


def apply(cfg: Config, layout: Layout, ranks: int, ranks_per_node: int = 0) -> Config:
    """cfg laid out as `layout` on `ranks` ranks (not validated: see problem())."""
    p = dataclasses.replace(cfg.parallel, world_size=ranks, tensor=layout.tensor, pipeline=layout.pipeline,
                            context=layout.context, expert=layout.expert, order=layout.order,
                            zero_stage=layout.zero, schedule=layout.schedule, chunks=layout.chunks,
                            bucket_cap_mb=layout.bucket_mb, sequence_parallel=False, hybrid=False,
                            algorithm="ring",  # ZeRO and the model-parallel groups reduce on the ring
                            ranks_per_node=ranks_per_node if ranks_per_node and ranks % ranks_per_node == 0
                            else 0, pipeline_emulate_ms=0.0)
    return dataclasses.replace(cfg, parallel=p,
                               train=dataclasses.replace(cfg.train, micro_batches=layout.micro_batches),
                               memory=dataclasses.replace(cfg.memory, checkpointing=layout.checkpointing))


def problem(cfg: Config) -> str | None:
    """The config rules' one line against a laid-out config, or None when a run would accept it."""
    found = combination_problem(cfg)
    return None if found is None else f"{found[0]}: {found[1]}"


def degree_splits(cfg: Config, ranks: int) -> Iterator[tuple[int, int, int, int, int]]:
    """(data, tensor, pipeline, context, expert) with data x tensor x pipeline x context = ranks, pruned by
    what the model can take before any config is built: tensor divides the heads, pipeline at most the
    layers, context a GPT's only, expert a divisor of the experts."""
    m = cfg.model
    gpt = m.kind == "gpt"
    for t, p in itertools.product(divisors(ranks), repeat=2):
        if ranks % (t * p):
            continue
        if gpt and m.n_head % t or p > (m.n_layer if gpt else len(m.widths) - 1):
            continue
        for c in divisors(ranks // (t * p)) if gpt else [1]:
            d = ranks // (t * p * c)
            experts = [e for e in divisors(d * c) if m.n_experts % e == 0] if gpt and m.n_experts else [1]
            for e in experts:
                yield d, t, p, c, e


def micro_batch_choices(rows: int, pipeline: int) -> list[int]:
    """Micro-batches per step for a replica of `rows` rows (see the module docstring): without a pipeline 1,
    2 and 4 where they divide the rows; with one, the fewest that divide the rows at or above p, 2p and 4p
    (a pipeline of p stages needs p in flight to fill), and one row each; at most MAX_MICRO_BATCHES."""
    divisors = [m for m in range(1, rows + 1) if rows % m == 0]
    if pipeline == 1:
        return [m for m in (1, 2, 4) if m in divisors]
    at_least = {next((m for m in divisors if m >= k * pipeline), rows) for k in (1, 2, 4)} | {rows}
    return sorted(m for m in at_least if m <= MAX_MICRO_BATCHES) or [min(at_least)]


def layouts(cfg: Config, ranks: int, replica_bytes: float) -> Iterator[Layout]:
    """Every layout in the search space (before the rules), the preferred variant of each shape first.
    `replica_bytes`: a replica's gradient bytes (the whole model's), to leave out bucket sizes that make
    more than MAX_BUCKETS buckets."""
    gpt = cfg.model.kind == "gpt"
    for d, t, p, c, e in degree_splits(cfg, ranks):
        rows = cfg.train.global_batch // d if cfg.train.global_batch % d == 0 else 0
        if not rows:
            continue  # the rules' "global batch cannot be split evenly", before building any config
        schedules = SCHEDULES if p > 1 else (("1f1b", 1),)
        orders = ORDERS if p > 1 and d > 1 else ORDERS[:1]
        zeros = (0, 1) if p > 1 else (0,) if e > 1 else (0, 1, 2, 3)
        per_rank = replica_bytes / (t * p)
        buckets = [b for b in BUCKETS_MB if math.ceil(per_rank / (b * 2**20)) <= MAX_BUCKETS] \
            or [BUCKETS_MB[-1]]
        for m in micro_batch_choices(rows, p):
            for (schedule, chunks), ckpt in itertools.product(schedules, CHECKPOINTING if gpt else ("none",)):
                for order, zero, bucket in itertools.product(orders, zeros, buckets):
                    yield Layout(d, t, p, c, e, order, zero, m, schedule, chunks, ckpt, bucket)
