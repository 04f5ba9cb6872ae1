"""The pipeline schedules, one module each, built by name (engine.config.vocabulary.PIPELINE_SCHEDULES).

Each module has `build(ranks, micro_batches, chunks) -> Schedule`, its published bubble as text (FORMULA)
and as a number (`bubble`: idle share of the step with equal action times); a module whose formula depends
on the shape (interleaved, when p does not divide m) says which with `formula(ranks, micro_batches,
chunks)`. A shape a schedule cannot run
is a ShapeError (a ValueError) whose message is one line saying what works.
"""

from __future__ import annotations

from functools import lru_cache
from types import ModuleType

from engine.config.vocabulary import PIPELINE_SCHEDULES
from engine.parallel.pipeline.ir import Schedule
from engine.parallel.pipeline.schedules import gpipe, interleaved, one_f_one_b, zb_h1
from engine.parallel.pipeline.schedules.shape import ShapeError

__all__ = ["MODULES", "ShapeError", "build_schedule", "formula_bubble", "module_of"]

MODULES: dict[str, ModuleType] = {"gpipe": gpipe, "1f1b": one_f_one_b, "interleaved": interleaved,
                                  "zb-h1": zb_h1}
assert set(MODULES) == set(PIPELINE_SCHEDULES), "every schedule the vocabulary names has a module"


def module_of(name: str) -> ModuleType:
    if name not in MODULES:
        raise ValueError(f"unknown pipeline schedule {name!r}: use one of {', '.join(PIPELINE_SCHEDULES)}")
    return MODULES[name]


@lru_cache(maxsize=64)
def build_schedule(name: str, ranks: int, micro_batches: int, chunks: int = 1) -> Schedule:
    """Every pipeline rank's actions for one step of `micro_batches` micro-batches over `ranks` ranks.
    Kept for reuse (a Schedule is immutable): the config rules, the memory estimator and the projection
    each build the same one for a layout, and the planner judges thousands of layouts."""
    module = module_of(name)
    if ranks < 1:
        raise ShapeError("ranks", ranks, "a pipeline needs at least 1 rank")
    if micro_batches < 1:
        raise ShapeError("micro_batches", micro_batches, "a step needs at least 1")
    schedule: Schedule = module.build(ranks, micro_batches, chunks)
    return schedule


def formula_bubble(name: str, ranks: int, micro_batches: int, chunks: int = 1) -> tuple[str, float]:
    """The published bubble of schedule `name` as an idle share of the step (equal action times: F = B for
    gpipe, 1f1b and interleaved, F = I = W for zb-h1), and its formula as text."""
    module = module_of(name)
    text = module.formula(ranks, micro_batches, chunks) if hasattr(module, "formula") else module.FORMULA
    return text, float(module.bubble(ranks, micro_batches, chunks))
