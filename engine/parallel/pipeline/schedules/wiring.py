"""From the order of a rank's compute to its full list of actions, messages included.

Consecutive communication actions form one batch (engine.parallel.pipeline.ir). `wire` posts each compute
step's receives just before it and its sends just after it, so a step's sends share a batch with the next
step's receives: in 1F1B's steady state the activation of the forward just run goes out while the gradient
the next backward needs comes in (Megatron's send_forward_recv_backward), and the other way round after
the backward. A step is one compute action, or several run back to back between two batches (interleaved
1F1B's forward-and-backward pair). Hand-offs between stages on one rank (one pipeline rank) need no message.

`wire_timed` places each send instead where its receiver will be waiting for it, on a timeline with
reference action times: under the batch semantics a send waits for its receive, so a send posted early
would idle its rank (zero-bubble schedules, whose ranks run ahead of one another, need this).
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.parallel.pipeline.ir import Action, Op, Schedule
from engine.parallel.pipeline.simulate import Durations, message_key, simulate

Compute = tuple[Op, int, int]  # (F | B | I | W, micro-batch, virtual stage)
Step = Sequence[Compute]  # compute actions posted between two batches
STARTS_BACKWARD = (Op.BACKWARD, Op.BACKWARD_INPUT)  # the backward halves that carry a gradient on


def one_by_one(order: Sequence[Compute]) -> list[Step]:
    return [(c,) for c in order]


def receives(ranks: int, last: int, rank: int, op: Op, mb: int, s: int) -> list[Action]:
    """What compute (op, mb, s) on `rank` needs from another rank first."""
    if op == Op.FORWARD and s > 0 and (s - 1) % ranks != rank:
        return [Action(Op.RECV_ACT, mb, s, (s - 1) % ranks)]
    if op in STARTS_BACKWARD and s < last and (s + 1) % ranks != rank:
        return [Action(Op.RECV_GRAD, mb, s, (s + 1) % ranks)]
    return []


def sends(ranks: int, last: int, rank: int, op: Op, mb: int, s: int) -> list[Action]:
    """What compute (op, mb, s) on `rank` hands to another rank."""
    if op == Op.FORWARD and s < last and (s + 1) % ranks != rank:
        return [Action(Op.SEND_ACT, mb, s, (s + 1) % ranks)]
    if op in STARTS_BACKWARD and s > 0 and (s - 1) % ranks != rank:
        return [Action(Op.SEND_GRAD, mb, s, (s - 1) % ranks)]
    return []


def wire(name: str, ranks: int, micro_batches: int, chunks: int,
         steps: Sequence[Sequence[Step]]) -> Schedule:
    """The schedule whose rank r runs the compute steps `steps[r]` in order, with its messages added."""
    last = ranks * chunks - 1
    lists = []
    for r, rank_steps in enumerate(steps):
        actions: list[Action] = []
        for step in rank_steps:
            actions += [a for c in step for a in receives(ranks, last, r, *c)]
            actions += [Action(*c) for c in step]
            actions += [a for c in step for a in sends(ranks, last, r, *c)]
        lists.append(tuple(actions))
    return Schedule(name, ranks, micro_batches, chunks, tuple(lists))


def wire_timed(name: str, ranks: int, micro_batches: int, chunks: int, orders: Sequence[Sequence[Compute]],
               reference: Durations) -> Schedule:
    """Rank r computes `orders[r]`; each receive just before its compute, each send in the batch its
    receiver posts at the same moment on the timeline with `reference` times (buffered sends, so nobody
    waits on a send there): before the sender's first compute that starts no earlier. Waiting sends play
    out that same timeline when the receive is posted at a boundary between two of the sender's computes,
    as it always is when the compute actions the orders use take one time each (ZB-H1's F = I = W);
    otherwise the sender posts after the receive and the receiver waits for it. The checker proves each
    schedule built this way deadlock-free."""
    draft = wire(name, ranks, micro_batches, chunks, [one_by_one(o) for o in orders])
    timeline = simulate(draft, reference, eager_sends=True)
    wanted = {}  # message -> when its receive is posted
    for r, spans in enumerate(timeline.spans):
        for span in spans:
            if span.action.op in (Op.RECV_ACT, Op.RECV_GRAD):
                wanted[message_key(span.action, r)] = span.start
    lists = []
    for r, spans in enumerate(timeline.spans):
        computes = [s for s in spans if s.action.op.is_compute]
        late_sends: list[list[Action]] = [[] for _ in range(len(computes) + 1)]  # [i]: sent before compute i
        done = 0  # computes that have run before the current span
        for span in spans:
            if span.action.op.is_compute:
                done += 1
            elif span.action.op in (Op.SEND_ACT, Op.SEND_GRAD):
                at = wanted[message_key(span.action, r)]
                slot = next((i for i in range(done, len(computes)) if computes[i].start >= at), len(computes))
                late_sends[slot].append(span.action)
        actions: list[Action] = []
        for i, span in enumerate(computes):
            actions += late_sends[i]
            actions += receives(ranks, ranks * chunks - 1, r, span.action.op, span.action.micro_batch,
                                span.action.stage)
            actions.append(span.action)
        actions += late_sends[-1]
        lists.append(tuple(actions))
    return Schedule(name, ranks, micro_batches, chunks, tuple(lists))
