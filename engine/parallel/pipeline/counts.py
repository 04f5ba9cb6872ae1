"""What a schedule holds and sends, read off its action lists: the figures the published schedules are
known by (1F1B's warm-up, GPipe's m micro-batches in flight) and that the memory estimator and the
projection charge for.

A (micro-batch, stage) pair is in flight on its rank from its forward until the backward that frees its
activations: B, or I, the input-gradient half (W keeps only what the weight gradient needs: each layer's
input and output gradient). `peak_held` counts until the pair is wholly done (B or W).
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.parallel.pipeline.ir import Action, Op, Schedule

FREES_ACTIVATIONS = (Op.BACKWARD, Op.BACKWARD_INPUT)
FINISHES = (Op.BACKWARD, Op.BACKWARD_WEIGHT)


def _peak(actions: Sequence[Action], ends: tuple[Op, ...]) -> int:
    held = peak = 0
    for a in actions:
        if a.op == Op.FORWARD:
            held += 1
            peak = max(peak, held)
        elif a.op in ends:
            held -= 1
    return peak


def peak_in_flight(schedule: Schedule) -> tuple[int, ...]:
    """Per rank, the most (micro-batch, stage) pairs whose activations are held at once (forward run, B or I
    not yet). One stage per rank: micro-batches; interleaved: pairs of micro-batch and chunk."""
    return tuple(_peak(acts, FREES_ACTIVATIONS) for acts in schedule.actions)


def peak_held(schedule: Schedule) -> tuple[int, ...]:
    """Per rank, the most pairs begun and not wholly done (forward run, B or W not yet): the same as
    peak_in_flight except where W is run late (zero-bubble schedules)."""
    return tuple(_peak(acts, FINISHES) for acts in schedule.actions)


def forwards_before_first_backward(schedule: Schedule) -> tuple[int, ...]:
    """Per rank, the forwards run before its first backward: the warm-up and the steady state's first
    forward (1F1B: min(p - r - 1, m) + 1 while m allows)."""
    counts = []
    for acts in schedule.actions:
        computes = [a.op for a in acts if a.op.is_compute]
        first_backward = next((i for i, op in enumerate(computes) if op in FREES_ACTIVATIONS), len(computes))
        counts.append(sum(op == Op.FORWARD for op in computes[:first_backward]))
    return tuple(counts)


def messages(schedule: Schedule) -> dict[str, int]:
    """Point-to-point messages of one step, by what they carry (each counted once, at its send)."""
    sent = [a.op for acts in schedule.actions for a in acts]
    return {"activation": sent.count(Op.SEND_ACT), "gradient": sent.count(Op.SEND_GRAD)}
