"""The compute part of a calibration (engine.projection.calibrate): `level` busy ranks (1 or 2) each train
the model alone, in step with each other, timing forward, backward, the update and the bookkeeping at
several micro-batch sizes; their imbalance; κ of a bucket's all-reduce beside compute (at 2 ranks); and
how fast a large copy runs with those ranks busy. Every timed figure is a lower quartile (quantile.py).
An MoE model's routing in those steps is kept too: λ, the busiest expert-parallel rank's rows over the
mean, for every EP degree (engine.projection.routing), which the step model then takes (expert.py).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Sequence

import numpy as np

from engine.comm.launch import run_ranks
from engine.config import Config, to_dict
from engine.dtypes import itemsize
from engine.moe import moe_layers
from engine.projection.interference import measure_interference
from engine.projection.quantile import low_quantile
from engine.projection.routing import imbalance_by_degree

LEVELS = (1, 2)  # ranks computing at once on the host
IMBALANCE_STEPS = 6  # barrier-timed steps of the second imbalance estimate (see time_phases)


def measure_compute(cfg: Config, dtypes, rows: list[int], cores: int, steps: int, warmup: int,
                    levels=LEVELS, context_degrees: Sequence[int] = ()) -> tuple[dict, dict]:
    """{dtype: {level: curve}} for cfg's model, and copy bandwidth per level; ring attention's figures for
    cfg's context-parallel degree and `context_degrees` (a planner's: the base has none of its own)."""
    degrees = sorted({cfg.parallel.context, *context_degrees} - {1})
    entry: dict = {d: {} for d in dtypes}
    copies: dict = {}
    for level in levels:
        if level > max(1, cores):
            continue  # more busy ranks than cores is time-slicing, which the model scales
        args = (to_dict(cfg), list(dtypes), rows, steps, warmup, degrees)
        results = run_ranks(level, "processes", _compute_rank, args, timeout_s=300.0)  # auto threads per rank
        for dtype in dtypes:
            per_rank = [r["curves"][dtype] for r in results]
            entry[dtype][str(level)] = {key: _mean_over_ranks(per_rank, key) for key in per_rank[0]}
        copies[str(level)] = statistics.mean(r["copy_bytes_per_s"] for r in results)
    return entry, copies


def _mean_over_ranks(per_rank: list[dict], key: str):
    values = [r[key] for r in per_rank]
    if isinstance(values[0], dict):
        return _mean_of_dicts(values)
    if isinstance(values[0], list):
        return [statistics.mean(column) for column in zip(*values)]
    return statistics.mean(values)


def _mean_of_dicts(values: list[dict]) -> dict:
    return {k: statistics.mean(v[k] for v in values) for k in values[0]}


def _compute_rank(comm, emit, cfg_dict: dict, dtypes: list[str], rows: list[int], steps: int, warmup: int,
                  degrees: list[int]) -> dict:
    """One busy rank: its model alone at every size and precision, in step with the other ranks."""
    from engine.config import from_dict
    curves = {}
    per_row = cfg_dict["model"].get("block_size", 1) if cfg_dict["model"]["kind"] == "gpt" else 1
    for dtype in dtypes:
        per_size = [time_phases(comm, from_dict(one_rank_config(cfg_dict, dtype, r), source="<calibration>"),
                                steps, warmup, interference=r == rows[-1]) for r in rows]
        ring = [{k: v for c in degrees for k, v in _ring_blocks(comm, cfg_dict, dtype, r, c).items()}
                for r in rows]
        curves[dtype] = {"tokens": [r * per_row for r in rows], "forward_s": [p["forward"] for p in per_size],
                         **{k: [figures[k] for figures in ring] for k in ring[0]},
                         "backward_s": [p["backward"] for p in per_size],
                         "optimizer_s_per_element": statistics.mean(p["optimizer"] / p["n_params"]
                                                                    for p in per_size),
                         "other_s": statistics.mean(p["other"] for p in per_size),
                         "imbalance": statistics.mean(p["imbalance"] for p in per_size),
                         **({"expert_imbalance": _mean_of_dicts([p["expert_imbalance"] for p in per_size])}
                            if "expert_imbalance" in per_size[0] else {}),
                         **{k: v for k, v in per_size[-1].items() if k.startswith("interference")}}
    return {"curves": curves, "copy_bytes_per_s": _copy_rate(comm)}


def _ring_blocks(comm, cfg_dict: dict, dtype: str, rows: int, c: int) -> dict:
    """Context parallelism of degree c: ring attention's blocks, a rank's whole pass and (with a second busy
    rank) a hop beside a block, at the rank's rows and heads (engine.projection.ring_calibration and
    ring_pass_calibration: `rows` rows of the whole model's work are a CP rank's b·s/(t·c) tokens, so it
    holds rows·t·c rows of s/c tokens and n_head/t heads), each under its degree's key."""
    from engine.projection.ring_calibration import degree_key, time_ring_blocks
    from engine.projection.ring_pass_calibration import time_hops, time_ring_passes
    m, t = cfg_dict["model"], cfg_dict["parallel"].get("tensor", 1)
    shape = (rows * t * c, m["n_head"] // t, m["n_embd"] // m["n_head"], m["block_size"], c, dtype)
    comm.barrier()  # the busy ranks time them together, as they trained
    figures = time_ring_blocks(*shape) | time_ring_passes(*shape)
    if comm.world_size > 1:
        figures |= time_hops(comm, *shape)
    return {degree_key(c, name): seconds for name, seconds in figures.items()}


def one_rank_config(cfg_dict: dict, dtype: str, rows: int) -> dict:
    """cfg as one rank training `rows` rows per step in `dtype`: no accumulation, no checkpointing, the whole
    model (a tensor-parallel rank's compute is projected from the whole model's curves:
    engine.projection.tensor_parallel; a pipeline stage's likewise: engine.projection.pipeline)."""
    d = json.loads(json.dumps(cfg_dict))
    d["parallel"].update(world_size=1, backend="threads", zero_stage=0, ranks_per_node=0, tensor=1,
                         sequence_parallel=False, pipeline=1, chunks=1, pipeline_emulate_ms=0.0, context=1,
                         expert=1)
    d.pop("emulate", None)
    d["train"].update(global_batch=rows, micro_batches=1)
    d["precision"]["dtype"] = dtype
    d["memory"]["checkpointing"] = "none"
    return d


def time_phases(comm, cfg: Config, steps: int, warmup: int, interference: bool = False) -> dict:
    """Low-quantile seconds of a step's phases for a one-rank trainer, ranks stepping together; with
    `interference` and other busy ranks, also κ of a bucket's all-reduce beside its forward and backward
    (engine.projection.interference; 1 with one rank, whose collectives never overlap anything)."""
    from engine.data import rank_slice
    trainer = one_rank_trainer(cfg)
    replica = trainer.replica
    later_waits: list[float] = []
    later_computes: list[float] = []
    try:
        phases, waits, computes = timed_steps(comm, trainer, warmup, steps)
        beside: dict = {}
        if comm.world_size > 1:
            if interference:
                x, y = rank_slice(trainer.dataset.global_batch(0, "train"), 0, 1, 0, 1)

                def forward_backward() -> None:
                    replica.zero_grad()
                    replica.begin_micro(sync=True)
                    replica.backward(trainer._loss(x, y), 1.0)
                    replica.finish_backward()
                bucket = min(int(cfg.parallel.bucket_cap_mb * 2**20),
                             trainer.n_params * itemsize(cfg.precision.dtype))
                beside = measure_interference(comm, forward_backward, bucket)
            _, later_waits, later_computes = timed_steps(comm, trainer, 1, IMBALANCE_STEPS)
    finally:
        replica.close()
    imbalance = imbalance_share((waits, computes), (later_waits, later_computes))
    return {**{k: low_quantile(v) for k, v in phases.items()}, "n_params": trainer.n_params,
            "imbalance": imbalance, **beside, **_routing(trainer.model, cfg.model.n_experts)}


def _routing(model, n_experts: int) -> dict:
    """An MoE model's routing in the steps just trained, as λ per EP degree (engine.projection.routing);
    nothing for a model without experts."""
    layers = moe_layers(model)
    if not layers:
        return {}
    return {"expert_imbalance": imbalance_by_degree([[f["tokens_per_expert"] for f in layer.step_stats]
                                                     for layer in layers], n_experts)}


def one_rank_trainer(cfg: Config):
    """A trainer of cfg on a one-rank group of its own (its collectives never leave this thread)."""
    from engine.comm.base import Signals
    from engine.comm.threads import ThreadGroup
    from engine.trainer import Trainer
    return Trainer(cfg, ThreadGroup(1, cfg.parallel.timeout_s, Signals()).communicator(0))


def imbalance_share(*stretches: tuple[list[float], list[float]]) -> float:
    """The ranks' imbalance: the time a rank waits at the barrier for the slower one, as a share of its
    step's compute, from stretches of (waits, compute seconds) taken seconds apart (empty ones skipped).
    The lower quartiles, as for every timed figure: a step another job slowed on one rank is load, not
    the ranks' own imbalance (and a run's measured waits are taken the same way, validate.py). And the
    lowest of the stretches: on a shared host one rank's core can be slowed for seconds at a time (a
    neighbour on the same physical core), which the quartile of one stretch takes for the ranks' own skew
    (one calibration read 7.5% where the runs it predicted measured 0.2-2%)."""
    shares = [low_quantile(waits) / low_quantile(computes) for waits, computes in stretches if waits]
    return min(shares, default=0.0)


def timed_steps(comm, trainer, warmup: int, steps: int) -> tuple[dict, list, list]:
    """`warmup` + `steps` steps of the one-rank `trainer`, a barrier with the other busy ranks before
    each: the timed steps' phases, the waits at the barrier (after the first timed step: the first waits
    for the warm-up) and the steps' compute seconds."""
    from engine.data import rank_slice
    replica = trainer.replica
    phases: dict[str, list[float]] = {"forward": [], "backward": [], "optimizer": [], "other": []}
    waits, computes = [], []
    for i in range(warmup + steps):
        before = time.perf_counter()
        comm.barrier()  # waits for the slowest rank's previous step
        t0 = time.perf_counter()
        x, y = rank_slice(trainer.dataset.global_batch(i, "train"), 0, 1, 0, 1)
        replica.zero_grad()
        replica.begin_micro(sync=True)
        t1 = time.perf_counter()
        loss = trainer._loss(x, y)
        float(loss.data)
        t2 = time.perf_counter()
        replica.backward(loss, 1.0)
        replica.finish_backward()
        t3 = time.perf_counter()
        replica.step(1e-4, min(1.0, 1.0 / max(replica.grad_norm(), 1e-12)), i)
        t4 = time.perf_counter()
        if i >= warmup:
            for key, seconds in zip(phases, (t2 - t1, t3 - t2, t4 - t3, t1 - t0)):
                phases[key].append(seconds)
            computes.append(t4 - t0)
            if i > warmup:
                waits.append(t0 - before)
    return phases, waits, computes


def _copy_rate(comm, nbytes: int = 32 << 20, repeats: int = 7) -> float:
    """Bytes per second of one large numpy copy, the other ranks copying at the same time."""
    src, dst = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)
    times = []
    for _ in range(repeats):
        comm.barrier()
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return nbytes / low_quantile(times)
