"""When a pipeline rank's gradients are final, and the data-parallel reduce that starts there.

A model chunk's weight gradients are final after the last action of the step that writes them: the chunk's
last B (GPipe, 1F1B: the last micro-batch's; interleaved: each chunk's own last one) or its last W
(zero-bubble schedules, whose I writes only the input's gradient, engine.backward_split). Just before that
action the step arms the data-parallel replica with the chunk's parameters
(Replica.reduce_when_final): during the action each gradient bucket is all-reduced (DDP) or reduce-scattered
(ZeRO-1) on the replica's communication thread as soon as its last gradient is written, as the last
micro-batch's backward does without a pipeline, and the reduce runs on while the rank goes through what
remains of its schedule (the rest of that backward, the other chunks' backwards, the last gradient sends).
This is where PyTorch's DDP under torch.distributed.pipelining and Megatron's pipeline schedules (which
sync a chunk's gradients on its last backward) start theirs. Buckets are issued in order, and the ranks of a
data-parallel group run the same list and arm at the same actions, so they issue the same collectives in
the same order.

Held back: a tied weight's first-stage side (wte.weight) takes the last stage's gradient after the schedule
(step.py), so it is never armed; its bucket, and any after it in order, is issued by
Replica.reduce_accumulated() once the sum is done. Under emulation nothing writes a gradient, and every
bucket waits for reduce_accumulated() too.

Two threads, one transport: the communication thread drives the data-parallel group while this rank's
thread drives the pipeline group. The two groups join different pairs of ranks and every backend keeps its
state per pair (the threads backend's mailboxes, a socket and its shared-memory segments per link, MPI
initialised with MPI_THREAD_MULTIPLE by mpi4py). A tensor-parallel replica has no second thread: it reduces
on the rank's thread, inside the armed backward (engine.parallel.data.replica).
"""

from __future__ import annotations

from functools import partial

from engine.parallel.pipeline.executor import Hooks
from engine.parallel.pipeline.ir import Op, Schedule
from engine.parallel.pipeline.stage import StageRunner

WRITES_WEIGHT_GRADIENTS = (Op.BACKWARD, Op.BACKWARD_WEIGHT)


def final_weight_actions(schedule: Schedule, rank: int) -> dict[int, int]:
    """{index in `rank`'s action list: stage} of each of the rank's stages' last action that writes weight
    gradients."""
    last = {a.stage: i for i, a in enumerate(schedule.actions[rank]) if a.op in WRITES_WEIGHT_GRADIENTS}
    return {i: stage for stage, i in last.items()}


def reduce_hooks(schedule: Schedule, rank: int, runner: StageRunner, replica) -> Hooks:
    """The executor's `before` hooks that arm `replica` with each stage's parameters at its final weight
    action, less the tied weights (both sides: the copy is no parameter of the replica's)."""
    tied = {id(p) for tie in runner.tied_parameters() for p in tie.params if p is not None}
    hooks: dict = {}
    for i, stage in final_weight_actions(schedule, rank).items():
        params = [p for _, p in runner.stages[stage].named_parameters() if id(p) not in tied]
        hooks[i] = partial(replica.reduce_when_final, params)
    return hooks
