"""ZB-H1, the first zero-bubble schedule (Qi et al., "Zero Bubble Pipeline Parallelism", 2023).

The backward is split in two: I, the input gradient the previous stage waits for, and W, the weight
gradient nobody waits for. Rank r warms up as in 1F1B (min(p - r - 1, m) forwards), then alternates F and
I, and runs each W later: rank r holds back r of them, so the gradient runs up the pipeline one I per rank
and the W held back fill the cool-down that 1F1B leaves idle. With F, I and W of equal time the bubble is
(p - 1) / (3m + p - 1) of the step, a third of 1F1B's bubble time.

Memory, counted in micro-batches: a micro-batch's activations are in use from F to its I, as 1F1B's from
F to B (at most min(p - r, m) on rank r); what its W needs stays until W, and with W held back a rank has
up to min(p, m) micro-batches begun and not finished, 1F1B's count on rank 0. In bytes ZB-H1 holds more
than 1F1B, not at most as much (engine.memory.pipeline computes it and the ledger tests hold it to the
byte): after I a stage keeps its weight products' inputs and each Linear's output gradient (and more for a
checkpointed block); stage 0, which has no input gradient to make, keeps all its activations and the
gradient it was seeded with until W. So no rank holds less than under 1F1B, rank 0 holds more, and the
fullest rank can hold a multiple of 1F1B's fullest, more so with checkpointing (figures in
docs/pipeline-parallel.md; tests/memory/test_pp_zb_memory.py).
"""

from __future__ import annotations

from collections import deque

from engine.parallel.pipeline.ir import Op, Schedule
from engine.parallel.pipeline.schedules.shape import require_one_chunk
from engine.parallel.pipeline.schedules.wiring import Compute, wire_timed
from engine.parallel.pipeline.simulate import Durations

FORMULA = "(p-1)/(3m+p-1)"


def bubble(ranks: int, micro_batches: int, chunks: int = 1) -> float:
    return (ranks - 1) / (3 * micro_batches + ranks - 1)


def build(ranks: int, micro_batches: int, chunks: int = 1) -> Schedule:
    require_one_chunk("zb-h1", chunks)
    orders = []
    m = micro_batches
    for r in range(ranks):
        w = min(ranks - r - 1, m)
        # The later the stage, the more upstream stages wait on its I: rank r keeps r W back, so its
        # I follow each other as soon as their gradients arrive and its W go where it would idle.
        held_back = r
        order: list[Compute] = [(Op.FORWARD, mb, r) for mb in range(w)]
        weights: deque[int] = deque()
        for k in range(m - w):
            order += [(Op.FORWARD, w + k, r), (Op.BACKWARD_INPUT, k, r)]
            weights.append(k)
            if len(weights) > held_back:
                order.append((Op.BACKWARD_WEIGHT, weights.popleft(), r))
        for k in range(m - w, m):  # cool-down: each I followed by a W held back, the rest at the end
            order.append((Op.BACKWARD_INPUT, k, r))
            weights.append(k)
            order.append((Op.BACKWARD_WEIGHT, weights.popleft(), r))
        order += [(Op.BACKWARD_WEIGHT, mb, r) for mb in weights]
        orders.append(order)
    # Sends placed for F = I = W, the times the published pattern and its bubble assume.
    return wire_timed("zb-h1", ranks, micro_batches, 1, orders, Durations(1.0, 2.0, 1.0, 1.0))
