"""GPipe (all forwards, then all backwards): every micro-batch's activations are held at the turn, so a
rank keeps m micro-batches in flight. Bubble (p - 1) / (m + p - 1) of the step."""

from __future__ import annotations

from engine.parallel.pipeline.ir import Op, Schedule
from engine.parallel.pipeline.schedules.shape import require_one_chunk
from engine.parallel.pipeline.schedules.wiring import one_by_one, wire

FORMULA = "(p-1)/(m+p-1)"


def bubble(ranks: int, micro_batches: int, chunks: int = 1) -> float:
    return (ranks - 1) / (micro_batches + ranks - 1)


def build(ranks: int, micro_batches: int, chunks: int = 1) -> Schedule:
    require_one_chunk("gpipe", chunks)
    orders = [[(Op.FORWARD, mb, r) for mb in range(micro_batches)]
              + [(Op.BACKWARD, mb, r) for mb in range(micro_batches)] for r in range(ranks)]
    return wire("gpipe", ranks, micro_batches, 1, [one_by_one(o) for o in orders])
