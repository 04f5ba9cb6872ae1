"""The step model: one training step of a config on a machine, replayed on a two-thread timeline.

Compute: FLOPs (flops.py) over the machine's rate at this micro-batch size (compute.py) for forward and
backward, plus the recomputed forward of checkpointed blocks, the optimizer over the elements this rank
owns (the estimator's shard), the bookkeeping around a step, and the copies ZeRO-2/3 make when packing
gradients. Communication, on the buckets and units the engine really uses (engine.parallel.data.flat,
engine.parallel.data.buckets, the estimator's units), as the replicas issue it (engine.parallel.data):

    stage 0  on the last micro-batch, each bucket's all-reduce goes to the communication thread once
             every bucket up to it is ready (their gradients final, backward_events) and overlaps the
             rest of backward; the step waits for the last
    stage 1  the same with reduce-scatters; after the update the training thread all-gathers every bucket
    stage 2  every micro-batch reduce-scatters its buckets, packed by the training thread, at most two in
             flight; all-gathers after the update
    stage 3  every micro-batch all-gathers each unit before its forward and again before its backward
             (the next one prefetched while this one computes, `parallel.prefetch`) and reduce-scatters it
             when its gradients are final, at most two in flight
    always   the grad norm's all-reduce of one fp64 value when gradients are sharded, fp16's overflow flag
             (two values) likewise, and the all-reduce of three that averages the loss and the stop and
             pause votes over ranks (sparse_ring where they are fewer than the ranks); where ranks share a
             host, the wait for the slowest of them (compute.py's imbalance, calibrated); where ranks
             outnumber its cores, what is left of the last one's lag at each meeting (Timeline.lag)

Without `parallel.overlap` every collective is waited for where it is issued.

Pipeline parallelism (p > 1) is pipeline_step.py's: the schedule simulated, and the collectives around it.

Tensor parallelism (tensor_parallel.py): compute split t ways (what it does not split kept whole), its
collectives run on the training thread inside forward and backward, exposed; the data-parallel group
above is then the dp = world / t ranks holding the same shard (group_comm.py places it), and its buckets
and units are built over one rank's shard of the parameters (engine.memory.tensor_parallel.rank_shapes,
the estimator's: the plan's cut). With a tensor-parallel
model nanoDist runs the replica's collectives on the training thread as well (one thread drives a
communicator at a time), so they are replayed as without `parallel.overlap`: exposed, none prefetched.

Context parallelism (context.py): a rank's b·s/c tokens, its attention the blocks its layout gives the busiest
rank, ring attention's K/V hops inside forward and backward, beside the blocks of the chunk in hand (what
the blocks do not hide is exposed); a context group's ranks share their rows, so b = global batch /
(dp · micro-batches), and the gradients are reduced over data × context. Expert parallelism (expert.py): each
MoE layer's all-to-alls inside forward and backward (exposed), the busiest rank's expert rows λ times the
mean, then the experts' gradient reduce over the expert-data-parallel group. Under either the replica runs
inline, as under TP.
"""

from __future__ import annotations

import dataclasses

from engine.memory.expert import split_shapes
from engine.memory.tensor_parallel import rank_shapes
from engine.parallel.mesh import Mesh
from engine.projection.expert import ExpertParallel
from engine.projection.flops import BackwardEvent, FlopsOf, backward_events
from engine.projection.group_comm import GroupComm, group_members
from engine.projection.machine import Machine
from engine.projection.pipeline_step import predict_pipeline_step
from engine.projection.rank_work import rank_work
from engine.projection.step_parts import GroupPlan, StepBreakdown
from engine.projection.tensor_parallel import TensorParallel
from engine.projection.timeline import Task, Timeline
from engine.recompute import checkpointed_blocks


def predict_step(cfg, machine: Machine, flops_of: FlopsOf, owned_elements: int,
                 expert_imbalance: float | None = None) -> StepBreakdown:
    """One step of cfg (its world size, stage, precision, micro-batches) on `machine`. `owned_elements`:
    the optimizer's shard (engine.memory.estimator), which sets the update's cost; `expert_imbalance`: the
    busiest expert-parallel rank's rows over the mean (expert.py; None: its default)."""
    if cfg.parallel.pipeline > 1:  # a pipeline rank's step
        return predict_pipeline_step(cfg, machine, flops_of)
    p, dtype, world = cfg.parallel, cfg.precision.dtype, cfg.parallel.world_size
    mesh = Mesh.of(p)
    dp = mesh.degree("dpcp")  # the ranks holding the same weights; a context group's ranks share their rows
    micro, compute, k = cfg.train.micro_batches, machine.compute, machine.ranks_on_host
    work = rank_work(cfg, machine, flops_of)
    rows, tp, cp, forward_rate, backward_rate = (work.rows, work.tp, work.cp, work.forward_rate,
                                                 work.backward_rate)
    ep = ExpertParallel(cfg, flops_of.vocab, rows, machine, expert_imbalance)
    flops = ep.flops(work.flops)  # the busiest rank's
    # per block, the ring's blocks as timed on a calibrated machine in place of the curve's attention
    extra_fwd, extra_bwd = cp.extra_forward_s, cp.extra_backward_s
    blocks = len(flops.unit_forward)
    t_fwd = tp.split(flops.forward / forward_rate, "forward") + blocks * extra_fwd
    t_bwd = tp.split(flops.backward / backward_rate, "backward") + blocks * extra_bwd
    t_block_fwd = tp.split(flops.block_forward / forward_rate, "block") + extra_fwd
    t_units = [tp.split(f / forward_rate, "block") + extra_fwd for f in flops.unit_forward]
    ckpt = set(checkpointed_blocks(cfg.memory.checkpointing, cfg.model.n_layer)) if cfg.model.kind == "gpt" \
        else set()
    t_opt = compute.optimizer_s(owned_elements, dtype, k)
    tl = Timeline(shares_cores=machine.cpu_topology is not None, kappa=compute.interference(dtype, k),
                  lag=compute.meeting_lag_s(dtype, k), slicing=compute.slicing(dtype, k))
    # the gradient reduce: the ranks holding the same weights
    comm = GroupComm(machine, group_members(p, "dpcp", machine.topology.per_node))
    tl.compute(compute.other_s(dtype, k))
    events = backward_events(cfg, flops_of.vocab)
    plan = GroupPlan(cfg, flops_of.vocab, dp, split_shapes(cfg, rank_shapes(cfg, flops_of.vocab))[0])
    program = {0: _data_parallel, 1: _data_parallel, 2: _data_parallel, 3: _zero3}[p.zero_stage]
    if tp.active or cp.active or ep.active:  # the replica's collectives run on the training thread too:
        # nothing overlaps, nothing is prefetched (engine.parallel.data.replica: one thread drives a
        # communicator at a time, and the model's own collectives, hops and all-to-alls use it)
        cfg = dataclasses.replace(cfg, parallel=dataclasses.replace(p, overlap=False, prefetch=False))
    for m in range(micro):
        program(tl, comm, plan, cfg, events, t_fwd, t_bwd, t_block_fwd, ckpt, sync=m == micro - 1,
                t_units=t_units, tp=tp, inner=(cp, ep))
    tl.wait_all()  # finish_backward
    for seconds, cpu in ep.reduces():  # the split experts' gradients, after the replicated ones
        tl.blocking(seconds, cpu)
    tp.issue(tl, tp.per_step)  # the sequence region's gradients summed over the group; the norm's share
    sharded = p.zero_stage > 0 and dp > 1
    if sharded:
        tl.blocking(*comm.scalars(1))  # the gradient norm's sum of squares
        if dtype == "fp16":
            tl.blocking(*comm.scalars(2))  # the overflow flag and where it is
    tl.compute(t_opt)
    if p.zero_stage in (1, 2) and dp > 1:
        for size in plan.sizes:
            tl.blocking(*comm.half(size, reduce=False))  # the updated parameters, bucket by bucket
    if world > 1:
        tl.blocking(*GroupComm(machine).scalars(3))  # the loss and the stop and pause votes, over every rank
        tl.wait_for_peers(compute.imbalance_s(tl.compute_s, dtype, k))
    return StepBreakdown(
        step_s=tl.step_s, compute_s=tl.compute_s, overlapped_s=tl.overlapped_s, exposed_s=tl.exposed_s,
        interference_s=tl.interference_s, forward_s=micro * t_fwd, backward_s=micro * t_bwd,
        recompute_s=micro * len(ckpt) * t_block_fwd, optimizer_s=t_opt, comm_s=tl.comm_s,
        imbalance_s=tl.imbalance_s, algorithm=machine.algorithm, tp_s=tp.spent_s, tp=tp.summary(),
        cp_s=cp.spent_s, cp=cp.summary(), ep_s=ep.spent_s, ep=ep.summary())


def _data_parallel(tl: Timeline, comm: GroupComm, plan: GroupPlan, cfg, events: list[BackwardEvent],
                   t_fwd: float, t_bwd: float, t_block: float, ckpt: set, sync: bool, t_units: list[float],
                   tp: TensorParallel, inner: tuple) -> None:
    """Stages 0-2: one micro-batch's forward and backward with its bucket collectives; `inner`: the terms
    whose messages run inside forward and backward beside TP's (context.py's hops, expert.py's
    all-to-alls)."""
    stage, overlap = cfg.parallel.zero_stage, cfg.parallel.overlap
    reduces = (sync or stage == 2) and comm.ranks > 1
    _forward(tl, tp, inner, t_fwd, t_units)
    issue_early = reduces and (overlap or stage == 2)  # stage 2 packs buckets as they fill, overlap or not
    ready: set[int] = set()
    inflight: list[Task] = []
    issued = 0
    for event, seconds, recomputed in _timed(events, t_bwd, t_block, ckpt):
        _backward(tl, tp, inner, event, seconds, recomputed)
        ready.update(event.ready)
        while issue_early and issued < len(plan.sizes) and ready.issuperset(plan.members[issued]):
            _issue(tl, comm, plan, stage, issued, inflight, overlap)
            issued += 1
    while reduces and issued < len(plan.sizes):
        _issue(tl, comm, plan, stage, issued, inflight, overlap)
        issued += 1


def _forward(tl: Timeline, tp: TensorParallel, inner: tuple, t_fwd: float, t_units: list[float]) -> None:
    """One micro-batch's forward with its TP collectives, then the CP hops and EP all-to-alls it ran (all
    on the training thread: where in forward they fall does not change the step)."""
    tp.forward(tl, t_fwd, t_units)
    for term in inner:
        term.forward(tl)


def _backward(tl: Timeline, tp: TensorParallel, inner: tuple, event: BackwardEvent, seconds: float,
              recomputed: bool) -> None:
    tp.backward(tl, event, seconds, recomputed)
    for term in inner:
        term.backward(tl, event.layer, recomputed)


def _issue(tl: Timeline, comm: GroupComm, plan: GroupPlan, stage: int, b: int, inflight: list[Task],
           overlap: bool) -> None:
    size = plan.sizes[b]
    if stage == 0:
        tl.submit(*comm.all_reduce(size))
        return
    if stage == 1:
        tl.submit(*comm.half(size, reduce=True))
        return
    _reduce_into_shard(tl, comm, size, inflight, overlap)


def _reduce_into_shard(tl: Timeline, comm: GroupComm, size: float, inflight: list[Task],
                       overlap: bool) -> None:
    """ZeRO-2/3: at most two buffers in flight; pack the gradients (a copy on the training thread), then
    reduce-scatter on the communication thread (waited for at once without overlap)."""
    while len(inflight) >= 2:
        tl.wait(inflight.pop(0))
    tl.compute(comm.m.compute.copy_s(size, comm.m.ranks_on_host))
    inflight.append(tl.submit(*comm.half(size, reduce=True)))
    if not overlap:
        tl.wait(inflight.pop())


def _timed(events: list[BackwardEvent], t_bwd: float, t_block: float, ckpt: set):
    """(event, seconds, recomputed) in backward order; a checkpointed block's recompute runs before its first
    event (recomputed: this event carries it)."""
    seen: set = set()
    for event in events:
        recomputed = event.block in ckpt and event.block not in seen
        if recomputed:
            seen.add(event.block)
        yield event, event.share * t_bwd + (t_block if recomputed else 0.0), recomputed


def _zero3(tl: Timeline, comm: GroupComm, plan: GroupPlan, cfg, events: list[BackwardEvent], t_fwd: float,
           t_bwd: float, t_block: float, ckpt: set, sync: bool, t_units: list[float],
           tp: TensorParallel, inner: tuple) -> None:
    """Stage 3: one micro-batch with its unit gathers (forward and backward) and reduce-scatters."""
    timed = list(_timed(events, t_bwd, t_block, ckpt))
    if comm.ranks == 1:
        _forward(tl, tp, inner, t_fwd, t_units)
        for item in timed:
            _backward(tl, tp, inner, *item)
        return
    prefetch, overlap = cfg.parallel.prefetch, cfg.parallel.overlap
    outer = plan.units and plan.units[0] is None
    blocks = list(range(1 if outer else 0, len(plan.sizes)))
    gathers: dict[int, Task] = {}

    def gather(i: int) -> None:
        tl.compute(comm.m.compute.copy_s(plan.sizes[i] / comm.ranks, comm.m.ranks_on_host))
        gathers[i] = tl.submit(*comm.half(plan.sizes[i], reduce=False))

    def ensure(i: int) -> None:
        if i not in gathers:
            gather(i)
        tl.wait(gathers.pop(i))

    # forward: the outer unit, then each block with the next one prefetched
    order = ([0] if outer else []) + blocks
    for n, i in enumerate(order):
        ensure(i)
        if prefetch and n + 1 < len(order):
            gather(order[n + 1])
        if plan.units[i] is None or (n == 0 and not outer):
            tp.issue(tl, tp.embedding_forward)
        if plan.units[i] is not None:
            tl.compute(t_units[plan.units[i]])
            tp.issue(tl, tp.unit_forward.get(plan.units[i], []))
    tl.compute(max(0.0, t_fwd - sum(t_units)))  # the head and the loss
    tp.issue(tl, tp.head_forward)
    for term in inner:
        term.forward(tl)
    # backward: the outer unit again at the logits, then the blocks from the last, each prefetching the next
    back = ([0] if outer else []) + blocks[::-1]
    outside = [item for item in timed if item[0].block is None]  # the head first, the embeddings last (GPT)
    inflight: list[Task] = []
    for n, i in enumerate(back):
        ensure(i)
        if prefetch and n + 1 < len(back):
            gather(back[n + 1])
        unit = plan.units[i]
        if unit is None:
            if outside:
                _backward(tl, tp, inner, *outside[0])
            continue
        for item in timed:
            if item[0].block == unit:
                _backward(tl, tp, inner, *item)
        _reduce_into_shard(tl, comm, plan.sizes[i], inflight, overlap)
    for item in outside[1:]:
        _backward(tl, tp, inner, *item)
    if outer:  # its last gradient (the token embedding's, tied to the head) is final only now
        _reduce_into_shard(tl, comm, plan.sizes[0], inflight, overlap)
