"""1F1B: rank r runs min(p - r - 1, m) forwards to fill the pipeline (warm-up), then alternates one
forward and one backward (steady state), then runs the backwards left (cool-down). A rank holds at most
min(p - r, m) micro-batches in flight, whatever m is; the bubble is GPipe's, (p - 1) / (m + p - 1)."""

from __future__ import annotations

from engine.parallel.pipeline.ir import Op, Schedule
from engine.parallel.pipeline.schedules.shape import require_one_chunk
from engine.parallel.pipeline.schedules.wiring import Compute, one_by_one, wire

FORMULA = "(p-1)/(m+p-1)"


def bubble(ranks: int, micro_batches: int, chunks: int = 1) -> float:
    return (ranks - 1) / (micro_batches + ranks - 1)


def warmup(ranks: int, micro_batches: int, rank: int) -> int:
    """Forwards rank `rank` runs before its first backward, the last of the steady state's aside."""
    return min(ranks - rank - 1, micro_batches)


def build(ranks: int, micro_batches: int, chunks: int = 1) -> Schedule:
    require_one_chunk("1f1b", chunks)
    orders = []
    for r in range(ranks):
        w, m = warmup(ranks, micro_batches, r), micro_batches
        order: list[Compute] = [(Op.FORWARD, mb, r) for mb in range(w)]
        for k in range(m - w):
            order += [(Op.FORWARD, w + k, r), (Op.BACKWARD, k, r)]
        order += [(Op.BACKWARD, mb, r) for mb in range(m - w, m)]
        orders.append(one_by_one(order))
    return wire("1f1b", ranks, micro_batches, 1, orders)
