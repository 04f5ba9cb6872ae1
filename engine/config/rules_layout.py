"""The rules of the layout: the mesh's degrees against the world, the heads and the layers (mesh_problem),
what tensor and pipeline parallelism cannot split, schedule or run beside (tensor_problem, pipeline_problem),
and the axes this release does not train yet, which a command that only describes a layout accepts
(describing_layout). Kept out of engine.config.rules, which runs them first in its combination_problem.

Pure, like rules.py: each returns None or (key, problem, fix).
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

from engine.comm.collectives import ON_ANY_GROUP
from engine.config.vocabulary import IMPLEMENTED_AXES
from engine.config.wording import KeyedProblem, Problem, toml_repr
from engine.parallel.mesh import AXES

if TYPE_CHECKING:
    from engine.config.schema import Config


# True while a layout is only described (`nanodist-tui mesh`): every degree is then accepted
_DESCRIBING: ContextVar[bool] = ContextVar("describing_layout", default=False)


@contextmanager
def describing_layout() -> Iterator[None]:
    """Inside it, configs with degrees this release cannot train yet are valid: for commands that only
    describe a layout. Everything else is checked as for a run."""
    token = _DESCRIBING.set(True)
    try:
        yield
    finally:
        _DESCRIBING.reset(token)


def describing() -> bool:
    """Whether the layout is only being described (inside describing_layout)."""
    return _DESCRIBING.get()


def unimplemented_problem(p) -> KeyedProblem | None:
    """A mesh degree above 1 on an axis this release does not train yet (vocabulary.IMPLEMENTED_AXES)."""
    if _DESCRIBING.get():
        return None
    for axis, key in AXES.items():
        degree = 1 if axis == "dp" else getattr(p, key)  # dp's degree is what remains, always trainable
        if degree > 1 and axis not in IMPLEMENTED_AXES:
            return (f"parallel.{key}", f"{key} parallelism ({key} = {degree}) is not implemented yet in this "
                    "release", f"set parallel.{key} = 1 (`nanodist-tui mesh` shows the layout it would make)")
    return None


def mesh_problem(cfg: Config) -> KeyedProblem | None:
    """A layout that cannot be: degrees that do not fit the world, the heads or the layers."""
    m, p = cfg.model, cfg.parallel
    cell = p.tensor * p.pipeline * p.context
    if p.world_size % cell:
        return ("parallel.world_size", f"{p.world_size} is not a multiple of tensor {p.tensor} x pipeline "
                f"{p.pipeline} x context {p.context} = {cell}",
                f"use a world_size that is a multiple of {cell} (e.g. {_multiples(cell, p.world_size)}), or "
                "degrees whose product divides it")
    if m.kind == "gpt" and m.n_head % p.tensor:
        return ("parallel.tensor", f"{p.tensor} does not divide model.n_head {m.n_head}: each "
                "tensor-parallel rank holds whole attention heads",
                f"use a divisor of {m.n_head}: {_divisors(m.n_head)}")
    layers = m.n_layer if m.kind == "gpt" else len(m.widths) - 1
    if p.pipeline > layers:
        return ("parallel.pipeline", f"{p.pipeline} stages for {layers} layers: every stage needs at least "
                "one", f"use at most {layers}")
    dpcp = p.world_size // cell * p.context
    if dpcp % p.expert:
        return ("parallel.expert", f"{p.expert} does not divide the {dpcp} data x context ranks experts are "
                f"spread over (world_size {p.world_size} / (tensor {p.tensor} x pipeline {p.pipeline}))",
                f"use a divisor of {dpcp}: {_divisors(dpcp)}")
    if p.sequence_parallel and p.tensor == 1:
        return ("parallel.sequence_parallel", "splits the sequence over the tensor-parallel ranks, but "
                "parallel.tensor = 1", "set parallel.tensor > 1, or sequence_parallel = false")
    return None


def tensor_problem(cfg: Config) -> KeyedProblem | None:
    """What tensor parallelism (parallel.tensor > 1) cannot split, or cannot run beside: the sequence for
    sequence parallelism, an MLP's layers, and the collectives that need the whole world (with tensor > 1
    gradients are reduced over the data-parallel group: ranks apart by the tensor degree)."""
    m, p = cfg.model, cfg.parallel
    t = p.tensor
    if t == 1:
        return None
    if p.sequence_parallel and m.kind == "mlp":
        return ("parallel.sequence_parallel", "splits a sequence, and the mlp model has none",
                "set sequence_parallel = false")
    if p.sequence_parallel and m.block_size % t:
        return ("parallel.sequence_parallel", f"splits the context of model.block_size {m.block_size} tokens "
                f"{t} ways, and {t} does not divide it", f"use a block_size that is a multiple of {t}, or "
                "sequence_parallel = false")
    if m.kind == "mlp" and (problem := _mlp_tensor_problem(m.widths, m.dropout, t)):
        return ("parallel.tensor", *problem)
    if p.hybrid:
        return ("parallel.hybrid", "shards ZeRO state inside a node of the world's ranks; with tensor > 1 "
                "ZeRO shards over the data-parallel group", "set parallel.hybrid = false")
    if p.algorithm not in ON_ANY_GROUP:
        return ("parallel.algorithm", f"{toml_repr(p.algorithm)} runs over the whole world, and with tensor "
                f"{t} gradients are reduced over the data-parallel group",
                f"use one of {', '.join(map(toml_repr, ON_ANY_GROUP))}")
    return None


def pipeline_problem(cfg: Config) -> KeyedProblem | None:
    """What pipeline parallelism (parallel.pipeline > 1) cannot cut or schedule, or cannot run beside."""
    m, p = cfg.model, cfg.parallel
    stages = p.pipeline * p.chunks
    if p.pipeline == 1 and p.pipeline_emulate_ms:
        return ("parallel.pipeline_emulate_ms", "emulates a pipeline's compute, but parallel.pipeline = 1",
                "set parallel.pipeline > 1, or pipeline_emulate_ms = 0")
    if p.pipeline == 1:
        return None if p.chunks == 1 else (
            "parallel.chunks", f"{p.chunks} chunks split a pipeline rank's layers, but parallel.pipeline = 1",
            "set parallel.pipeline > 1, or chunks = 1")
    if m.kind == "mlp":
        return ("parallel.pipeline", "cuts a GPT's transformer blocks into stages; the mlp model has none",
                'set model.kind = "gpt", or parallel.pipeline = 1')
    if (p.chunks > 1) != (p.schedule == "interleaved"):
        return ("parallel.chunks", f"{p.chunks} with schedule {toml_repr(p.schedule)}: only \"interleaved\" "
                "runs several chunks per rank, and it needs 2 or more",
                'set chunks = 1, or schedule = "interleaved" with chunks >= 2')
    if stages > m.n_layer:
        return ("parallel.chunks", f"pipeline {p.pipeline} x chunks {p.chunks} = {stages} stages for "
                f"model.n_layer {m.n_layer} blocks: every stage needs one", "use fewer stages or more layers")
    if p.zero_stage >= 2:
        return ("parallel.zero_stage", f"ZeRO-{p.zero_stage} reduces (stage 2) or gathers (stage 3) inside "
                "the replica's own backward and forward, and a pipeline stage runs its backwards in its "
                "schedule's order outside them", "use zero_stage 0 or 1 with parallel.pipeline > 1")
    if p.hybrid or p.algorithm not in ON_ANY_GROUP:
        return ("parallel.hybrid" if p.hybrid else "parallel.algorithm", "runs over the whole world, and "
                f"with pipeline {p.pipeline} gradients are reduced over the data-parallel group",
                f"set hybrid = false and algorithm to one of {', '.join(map(toml_repr, ON_ANY_GROUP))}")
    from engine.parallel.pipeline.schedules import ShapeError, build_schedule  # here: they import config
    try:
        build_schedule(p.schedule, p.pipeline, cfg.train.micro_batches, p.chunks)
    except ShapeError as exc:
        return (_SCHEDULE_SHAPE_KEYS[exc.parameter], f"{exc.value} with schedule {toml_repr(p.schedule)}: "
                f"{exc.reason}", f"change {_SCHEDULE_SHAPE_KEYS[exc.parameter]} or parallel.schedule")
    return None


# A schedule's ShapeError names its shape parameter; the config key that sets it:
_SCHEDULE_SHAPE_KEYS = {"micro_batches": "train.micro_batches", "chunks": "parallel.chunks",
                        "ranks": "parallel.pipeline"}


def _mlp_tensor_problem(widths, dropout: float, t: int) -> Problem | None:
    """An mlp model splits as (column-, row-parallel) pairs of layers, each pair's hidden width t ways."""
    layers = len(widths) - 1
    if layers % 2:
        return (f"{t} splits the mlp model's layers in pairs (column-, then row-parallel), and its "
                f"{layers} layers do not pair up", "give model.widths an odd number of entries, or set "
                "parallel.tensor = 1")
    if uneven := [w for w in widths[1:-1:2] if w % t]:
        return (f"{t} does not divide the hidden width {uneven[0]} it splits", f"use hidden widths that are "
                f"multiples of {t}")
    if dropout and layers > 2:
        return (f"{t} splits the hidden layer's dropout mask, planned for one hidden layer only (the mlp "
                f"model has {layers - 1})", "set model.dropout = 0, or use one hidden layer")
    return None


def _multiples(n: int, near: int) -> str:
    low = n * max(1, near // n)
    return f"{low} or {low + n}" if low < near else str(low)


def divisors(n: int) -> list[int]:
    """The whole numbers that divide n, ascending (the degrees an axis of n things can take)."""
    return [d for d in range(1, n + 1) if n % d == 0]


def _divisors(n: int) -> str:
    return ", ".join(map(str, divisors(n)))
