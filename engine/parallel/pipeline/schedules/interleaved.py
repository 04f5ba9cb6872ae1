"""Interleaved 1F1B (Megatron-LM's virtual pipeline): each rank holds v model chunks, virtual stage s on
rank s % p, so a micro-batch passes every rank v times and the pipeline fills v times faster.

The order is Megatron-LM's. Micro-batches go in groups of p: a rank runs a group's forwards through its
chunk 0, then the same group through chunk 1, ... and its backwards the same way from the last chunk down.
Rank r warms up with (p - r - 1) * 2 + (v - 1) * p forwards, then alternates (a forward and a backward
between two message batches), then cools down.

Any m >= 1. A group must hold p micro-batches: its first one comes back to rank 0 for chunk 1 after
passing all p ranks, and a shorter group would have rank 0 wait for it while its neighbours wait, in the
same message batch, on rank 0 (the deadlock Megatron refuses such an m for). So when p does not divide m,
the table is built for m' = p * ceil(m / p) micro-batches (Megatron's, for a multiple of p) and the
d = m' - m the last group lacks are left out of every rank's list: their actions and messages vanish, the
steps around them stay in Megatron's order, and every message still meets its partner in the batch it did
(the checker plays p = 2..8, m = 1..3p+1, v = 2..4 out: no deadlock).

Bubble, every chunk's F taking one time and every chunk's B another (any ratio of B to F): the step is
(v m' + p - 1 - d) (F + B) and the share idle is (p - 1 + (v - 1) d) / (v m + p - 1 + (v - 1) d); with p
dividing m (d = 0) that is the published (p - 1) / (v m + p - 1). Each missing micro-batch shortens the
step by one F + B only, not by its v: the rest of its group still waits for the ring. Fewer micro-batches
than ranks (m < p) is the same rule (one short group): (v (p - m) + m - 1) / (v p + m - 1).

Warm-up and memory: rank r runs the forwards among the first min((p - r - 1) * 2 + (v - 1) * p, v m')
entries of the table that are real micro-batches, then its steady state's first forward if that one is
real; with p dividing m, it holds up to (p - r - 1) * 2 + (v - 1) * p + 1 (micro-batch, chunk) pairs in
flight (at most v m), each 1/v of the rank's layers.
"""

from __future__ import annotations

from engine.parallel.pipeline.ir import Op, Schedule
from engine.parallel.pipeline.schedules.shape import ShapeError
from engine.parallel.pipeline.schedules.wiring import Compute, Step, wire

FORMULA = "(p-1)/(v*m+p-1)"
FORMULA_SHORT_GROUP = "(p-1+(v-1)d)/(v*m+p-1+(v-1)d), d=p-m%p"  # p does not divide m: d > 0


def missing(ranks: int, micro_batches: int) -> int:
    """d: the micro-batches the last group lacks to fill the ring of ranks (0 when p divides m)."""
    return -micro_batches % ranks


def bubble(ranks: int, micro_batches: int, chunks: int = 1) -> float:
    extra = (chunks - 1) * missing(ranks, micro_batches)
    return (ranks - 1 + extra) / (chunks * micro_batches + ranks - 1 + extra)


def formula(ranks: int, micro_batches: int, chunks: int = 1) -> str:
    return FORMULA_SHORT_GROUP if missing(ranks, micro_batches) else FORMULA


def require_supported(ranks: int, micro_batches: int, chunks: int) -> None:
    """A ShapeError saying what works, for a shape this schedule does not run."""
    if chunks < 2:
        raise ShapeError("chunks", chunks,
                         "the interleaved schedule needs 2 or more chunks per rank (one chunk is 1f1b)")


def order_of_virtual_micro_batches(ranks: int, micro_batches: int, chunks: int) -> list[tuple[int, int]]:
    """(micro-batch, chunk) of each forward in a rank's order: groups of p micro-batches, chunk by chunk
    (Megatron's schedule table), for m rounded up to a multiple of p; entries whose micro-batch is m or
    more stand for the ones the last group lacks. A rank's backwards go in the same order, its chunks
    counted from the last."""
    padded = micro_batches + missing(ranks, micro_batches)
    return [(mb, c) for first in range(0, padded, ranks) for c in range(chunks)
            for mb in range(first, first + ranks)]


def warmup(ranks: int, micro_batches: int, chunks: int, rank: int) -> int:
    """Megatron's warm-up, in entries of the (rounded-up) table, real micro-batches or not."""
    padded = micro_batches + missing(ranks, micro_batches)
    return min((ranks - rank - 1) * 2 + (chunks - 1) * ranks, padded * chunks)


def build(ranks: int, micro_batches: int, chunks: int = 2) -> Schedule:
    require_supported(ranks, micro_batches, chunks)
    table = order_of_virtual_micro_batches(ranks, micro_batches, chunks)
    total = len(table)
    orders = []
    for r in range(ranks):
        def forward(k: int, r: int = r) -> Compute:
            mb, c = table[k]
            return (Op.FORWARD, mb, c * ranks + r)

        def backward(k: int, r: int = r) -> Compute:
            mb, c = table[k]
            return (Op.BACKWARD, mb, (chunks - 1 - c) * ranks + r)

        w = warmup(ranks, micro_batches, chunks, r)
        steps: list[Step] = [(forward(k),) for k in range(w)]
        # Steady state: a forward and a backward, then one batch with both their sends and the next pair's
        # receives (Megatron's send_forward_backward_recv_forward_backward): around the ring of ranks
        # every rank sends and receives at once, where one message at a time would wait in a circle.
        steps += [(forward(w + k), backward(k)) for k in range(total - w)]
        steps += [(backward(k),) for k in range(total - w, total)]
        real = [tuple(c for c in step if c[1] < micro_batches) for step in steps]
        orders.append([step for step in real if step])
    return wire("interleaved", ranks, micro_batches, chunks, orders)
