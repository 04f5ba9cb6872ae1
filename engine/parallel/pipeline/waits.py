"""When a pipeline rank waits for its communication, as data: one plan per rank's action list, which the
executor runs by and the memory estimate replays (engine.memory.pipeline), so the two agree on when every
message buffer is freed.

The executor posts each batch (a maximal run of communication actions, ir.py) as its list reaches it, without
waiting (engine.comm.exchange.post), and goes on computing. It waits

  * before a compute action that reads a received array (F of a stage > 0, B or I of a stage < last), for
    the batch that receives it: a receive posted early (interleaved posts some an action ahead) lands while
    the rank computes;
  * before a compute action, for every batch posted before the compute action preceding it: a batch has
    one compute action to complete in. So a sent output (or input gradient) is freed at most one compute
    action after its send was posted, whatever the schedule (GPipe's first stage sends m outputs before it
    receives anything: without this rule it would keep them all);
  * at the step's end, for all;

and always for batches in list order. These waits are a subset of the ones a blocking executor makes (it
waits for each batch before its next compute action), so a list that cannot deadlock that way (the checker's
semantics) cannot deadlock this way. In the schedules here no receive is waited for by the second rule before
the compute action that reads it.

Waiting for batches 0..k frees what they sent and hands on what they received. `done[j]`: the batches
complete before compute action j runs (0..done[j] - 1); `posted[j]`: the batches that precede it in the list,
posted before it runs (the ones after the last compute action are posted when it ends).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.parallel.pipeline.ir import Action, Op

RECEIVE_OF = {Op.FORWARD: Op.RECV_ACT, Op.BACKWARD: Op.RECV_GRAD, Op.BACKWARD_INPUT: Op.RECV_GRAD}


@dataclass(frozen=True)
class WaitPlan:
    batches: tuple[tuple[int, ...], ...]  # each batch's action indices, in list order
    computes: tuple[int, ...]  # the compute actions' indices, in list order
    posted: tuple[int, ...]  # posted[j]: batches that precede compute action j in the list
    done: tuple[int, ...]  # done[j]: batches waited for before compute action j runs


def wait_plan(actions: Sequence[Action]) -> WaitPlan:
    batches: list[tuple[int, ...]] = []
    computes: list[int] = []
    posted: list[int] = []
    run: list[int] = []
    for i, a in enumerate(actions):
        if a.op.is_compute:
            if run:
                batches.append(tuple(run))
                run = []
            computes.append(i)
            posted.append(len(batches))
        else:
            run.append(i)
    if run:
        batches.append(tuple(run))
    received: dict[tuple[Op | None, int, int], int] = {}  # (receive op, stage, micro-batch) -> its batch
    for k, batch in enumerate(batches):
        for a in (actions[i] for i in batch):
            if a.op in (Op.RECV_ACT, Op.RECV_GRAD):
                received[a.op, a.stage, a.micro_batch] = k
    done, count = [], 0
    for j, i in enumerate(computes):
        a = actions[i]
        needed = received.get((RECEIVE_OF.get(a.op), a.stage, a.micro_batch), -1) + 1
        if needed > posted[j]:  # received after it is read: a broken list, which the read reports
            needed = 0
        count = max(count, needed, posted[j - 1] if j else 0)
        done.append(count)
    return WaitPlan(tuple(batches), tuple(computes), tuple(posted), tuple(done))
