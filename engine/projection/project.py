"""A run projected over world sizes on a cluster: per world size the step and where it goes, throughput,
scaling efficiency, MFU, and per-rank memory by category (engine.memory.estimator, the same prediction the
memory command and the ledger tests use) with whether it fits.

Scaling: "weak" keeps the preset's rows per rank and micro-batch (the global batch grows with the ranks,
as one scales out in practice); "strong" keeps its global batch (world sizes it does not split over are
left out). World sizes beyond what a run here can launch are fine: the projection builds the config for
them without the launch limits.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from engine.config import Config
from engine.config.build import vocab_size
from engine.dtypes import master_dtype
from engine.memory.estimator import MemoryEstimate, estimate
from engine.projection.calibrate import Calibration
from engine.projection.clusters import Cluster
from engine.projection.flops import FlopsOf
from engine.projection.machine import Machine, make_machine
from engine.projection.step import predict_step
from engine.projection.step_parts import StepBreakdown

SCALINGS = ("weak", "strong")
DEFAULT_WORLD_SIZES = tuple(2**k for k in range(13))  # 1 ... 4096


@dataclass(frozen=True)
class Row:
    world_size: int
    global_batch: int
    step: StepBreakdown
    tokens_per_s: float
    scaling_efficiency: float
    mfu: float
    memory: dict  # category -> bytes at its own peak
    states: dict  # model states at rest
    peak_bytes: int  # highest simultaneous total
    fits: bool | None  # None when the cluster does not say how much memory a rank has

    def as_dict(self) -> dict:
        return {"world_size": self.world_size, "global_batch": self.global_batch, **self.step.as_dict(),
                "tokens_per_s": self.tokens_per_s, "scaling_efficiency": self.scaling_efficiency,
                "mfu": self.mfu, "memory": self.memory, "states": self.states, "peak_bytes": self.peak_bytes,
                "fits": self.fits}


def rank_memory(cluster: Cluster, ranks_on_host: int) -> float:
    """Bytes a rank may hold: the cluster's figure, or on a calibrated host its memory split over its ranks
    (0: unknown)."""
    if cluster["compute.memory_gb"]:
        return cluster["compute.memory_gb"] * 1e9
    if cluster.calibrated and hasattr(os, "sysconf"):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / max(1, ranks_on_host)
    return 0.0


def at_world_size(cfg: Config, world: int, scaling: str = "weak") -> Config | None:
    """cfg on `world` ranks (its global batch per `scaling`), or None when strong scaling cannot split it.
    The tensor-parallel degree stays; the data-parallel degree is what remains (world / t)."""
    t, cell = cfg.train, model_parallel_ranks(cfg.parallel)
    if scaling == "weak":
        rows = max(1, t.global_batch // (cfg.parallel.world_size // cell * t.micro_batches))
        batch = rows * (world // cell) * t.micro_batches
    else:
        batch = t.global_batch
        if batch % (world // cell * t.micro_batches):
            return None
    per_node = cfg.parallel.ranks_per_node if cfg.parallel.ranks_per_node and \
        world % cfg.parallel.ranks_per_node == 0 else 0
    return dataclasses.replace(cfg, train=dataclasses.replace(t, global_batch=batch),
                               parallel=dataclasses.replace(cfg.parallel, world_size=world,
                                                            ranks_per_node=per_node))


def model_parallel_ranks(parallel) -> int:
    """Ranks one data-parallel replica spans (tensor x pipeline x context): world sizes are multiples."""
    return parallel.tensor * parallel.pipeline * parallel.context


def predict(cfg: Config, cluster: Cluster, calibration: Calibration | None = None, vocab: int | None = None,
            flops_of: FlopsOf | None = None,
            expert_imbalance: float | None = None) -> tuple[StepBreakdown, MemoryEstimate, Machine]:
    """(step breakdown, memory estimate, machine) of cfg as it stands (its world size) on the cluster;
    `expert_imbalance`: the busiest expert-parallel rank's rows over the mean (engine.projection.expert)."""
    vocab = vocab or (vocab_size(cfg) if cfg.model.kind == "gpt" else 0)
    flops_of = flops_of or FlopsOf(cfg, vocab)
    mem = estimate(cfg, vocab)
    owned = mem.states["adam_m"] // master_dtype(cfg.precision.dtype).itemsize
    machine = make_machine(cluster, cfg, cfg.parallel.world_size, calibration, flops_of)
    return predict_step(cfg, machine, flops_of, owned, expert_imbalance), mem, machine


def project(cfg: Config, cluster: Cluster, world_sizes=DEFAULT_WORLD_SIZES,
            calibration: Calibration | None = None, scaling: str = "weak",
            expert_imbalance: float | None = None) -> dict:
    """{"preset", "cluster", "scaling", "rows": [Row ...], "skipped": [world sizes left out, with why]}."""
    vocab = vocab_size(cfg) if cfg.model.kind == "gpt" else 0
    flops_of = FlopsOf(cfg, vocab)
    rows, skipped = [], []
    base: Row | None = None
    for world in sorted(set(world_sizes)):
        if world > cluster.max_ranks:
            skipped.append({"world_size": world, "why": f"the cluster has {cluster.max_ranks} ranks"})
            continue
        if world % model_parallel_ranks(cfg.parallel):
            p = cfg.parallel
            skipped.append({"world_size": world, "why": f"not a multiple of tensor {p.tensor} x pipeline "
                                                        f"{p.pipeline} x context {p.context}"})
            continue
        dpcp = world // model_parallel_ranks(cfg.parallel) * cfg.parallel.context
        if dpcp % cfg.parallel.expert:
            skipped.append({"world_size": world, "why": f"expert {cfg.parallel.expert} does not divide the "
                                                        f"{dpcp} data x context ranks"})
            continue
        at = at_world_size(cfg, world, scaling)
        if at is None:
            cell = model_parallel_ranks(cfg.parallel)
            over = f"{world} ranks" if cell == 1 else f"{world // cell} data-parallel ranks"
            skipped.append({"world_size": world, "why": f"global batch {cfg.train.global_batch} does not "
                                                        f"split over {over}"})
            continue
        step, mem, machine = predict(at, cluster, calibration, vocab, flops_of, expert_imbalance)
        tokens = at.train.global_batch * flops_of.tokens_per_row
        tokens_per_s = tokens / step.step_s
        per_token = flops_of(tokens).training / tokens
        peak = machine.compute.peak(at.precision.dtype)
        capacity = rank_memory(cluster, machine.ranks_on_host)
        _, cats = mem.peak()
        peak_bytes = sum(cats.values())
        row = Row(world, at.train.global_batch, step, tokens_per_s, 1.0,
                  tokens_per_s * per_token / (world * peak) if peak else 0.0, mem.category_peaks(),
                  dict(mem.states), peak_bytes, peak_bytes <= capacity if capacity else None)
        base = base or row
        efficiency = (tokens_per_s / world) / (base.tokens_per_s / base.world_size)
        rows.append(dataclasses.replace(row, scaling_efficiency=efficiency))
    return {"preset": cfg.name, "cluster": cluster.name, "scaling": scaling, "rows": rows, "skipped": skipped}
