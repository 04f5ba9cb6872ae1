"""Interleaved 1F1B (Megatron-LM's virtual pipeline): each rank holds v model chunks, virtual stage s on
rank s % p, so a micro-batch passes every rank v times and the pipeline fills v times faster.

The order is Megatron-LM's. Micro-batches go in groups of p: a rank runs a group's forwards through its
chunk 0, then the same group through chunk 1, ... and its backwards the same way from the last chunk down.
Rank r warms up with (p - r - 1) * 2 + (v - 1) * p forwards, then alternates, then cools down. As in
Megatron, m must be a multiple of p (a group must fill the ring of ranks before it comes back to rank 0;
a shorter group would wait on it, and with one message batch at a time a rank blocks the ring): any other
m is refused in one line. Bubble (p - 1) / (v * m + p - 1); rank r holds up to
(p - r - 1) * 2 + (v - 1) * p + 1 (micro-batch, chunk) pairs in flight, each 1/v of the rank's layers.
"""

from __future__ import annotations

from engine.parallel.pipeline.ir import Op, Schedule
from engine.parallel.pipeline.schedules.shape import ShapeError
from engine.parallel.pipeline.schedules.wiring import Compute, Step, wire

FORMULA = "(p-1)/(v*m+p-1)"


def bubble(ranks: int, micro_batches: int, chunks: int = 1) -> float:
    return (ranks - 1) / (chunks * micro_batches + ranks - 1)


def require_supported(ranks: int, micro_batches: int, chunks: int) -> None:
    """A ShapeError saying what works, for a shape this schedule does not run."""
    if chunks < 2:
        raise ShapeError("chunks", chunks,
                         "the interleaved schedule needs 2 or more chunks per rank (one chunk is 1f1b)")
    if micro_batches % ranks:
        fits = ", ".join(str(ranks * k) for k in range(1, 4))
        raise ShapeError("micro_batches", micro_batches,
                         f"the interleaved schedule needs a multiple of the {ranks} pipeline ranks (it runs "
                         f"micro-batches in groups of one per rank): use {fits}, ...; or 1f1b, gpipe or "
                         "zb-h1, which take any number")


def order_of_virtual_micro_batches(ranks: int, micro_batches: int, chunks: int) -> list[tuple[int, int]]:
    """(micro-batch, chunk) of each forward in a rank's order: groups of p micro-batches, chunk by chunk
    (Megatron's schedule table). A rank's backwards go in the same order, its chunks counted from the last."""
    return [(mb, c) for first in range(0, micro_batches, ranks) for c in range(chunks)
            for mb in range(first, first + ranks)]


def warmup(ranks: int, micro_batches: int, chunks: int, rank: int) -> int:
    return min((ranks - rank - 1) * 2 + (chunks - 1) * ranks, micro_batches * chunks)


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
        orders.append(steps)
    return wire("interleaved", ranks, micro_batches, chunks, orders)
