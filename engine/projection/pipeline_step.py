"""A pipeline rank's step (parallel.pipeline > 1): the schedule (pipeline.py) and what the engine does around
it (engine.parallel.pipeline.step, engine.trainer), rank by rank, up to the meetings that join every rank.

For pipeline rank r, with E_r the end of its last action in the simulated schedule (pipeline.py):

    start      the step's bookkeeping (compute.other_s) and, with a tied head on another stage, the first
               stage's wte sent to the last (one message of V·h parameters, α + nβ on their link): the
               first forward waits for it, so the whole schedule starts that much later
    schedule   E_r after the start
    tied grad  the last stage's copy's gradient sent to the first once both are done (the same message)
    DP reduce  the buckets of the rank's own parameters (GroupPlan over them: DDP all-reduces, ZeRO-1
               reduce-scatters) on the data-parallel group, R_r in all: each chunk's leave once its last
               weight-gradient action is done and reduce on the communication thread beside the rest of
               the schedule (pipeline_reduce.py); done at D_r ≥ E_r, of which D_r − E_r is waited for
    meeting    the gradient norm's sum of squares over the pipeline group (fp16: the overflow flag too),
               ZeRO-1's over the data-parallel group, TP's over the tensor group: every rank waits for the
               last one there, at M = max_r D_r + the agreements
    update     the optimizer over the stage's parameters (÷ dp under ZeRO-1, then its all-gather): U_r
    loss       the loss and the stop and pause votes, all-reduced over every rank

    step = max_r(M + U_r) + loss + the wait for slower ranks sharing a host (compute.imbalance_s)

A later stage finishes its backwards earlier (in 1F1B the last stage by (p−1)·B), so its reduce hides in
the drain of the earlier stages; the first stage's does not. The breakdown reports the busiest rank: its
compute, the rest of the step exposed (the bubble and the messages it waits on included), its reduce's
hidden part as overlapped, and no interference counted.
"""

from __future__ import annotations

from collections import Counter

from engine.dtypes import itemsize
from engine.parallel.mesh import Mesh
from engine.projection.context import ContextParallel
from engine.projection.flops import FlopsOf, backward_events
from engine.projection.group_comm import GroupComm, group_members
from engine.projection.machine import Machine
from engine.projection.pipeline import Pipeline, neighbour_link
from engine.projection.pipeline_reduce import bucket_ready, final_ends, reduce_done
from engine.projection.rank_work import rank_work
from engine.projection.step_parts import GroupPlan, StepBreakdown
from engine.projection.tensor_parallel import TensorParallel
from engine.recompute import checkpointed_blocks


def pipeline_of(cfg, machine: Machine, flops_of: FlopsOf) -> tuple[Pipeline, TensorParallel, ContextParallel]:
    """The pipeline term of cfg on `machine` (simulated), and the TP and CP terms its stages carry."""
    vocab, work = flops_of.vocab, rank_work(cfg, machine, flops_of)
    rows, tp, cp, flops = work.rows, work.tp, work.cp, work.flops
    forward_rate, backward_rate = work.forward_rate, work.backward_rate
    seconds = (tp.split(flops.forward / forward_rate, "forward"),
               tp.split(flops.backward / backward_rate, "backward"),
               tp.split(flops.block_forward / forward_rate, "block"))
    ckpt = set(checkpointed_blocks(cfg.memory.checkpointing, cfg.model.n_layer))
    pipe = Pipeline(cfg, vocab, rows, machine, flops, backward_events(cfg, vocab), seconds, ckpt, tp, cp)
    return pipe, tp, cp


def predict_pipeline_step(cfg, machine: Machine, flops_of: FlopsOf) -> StepBreakdown:
    p, dtype, vocab = cfg.parallel, cfg.precision.dtype, flops_of.vocab
    dp, per_node = Mesh.of(p).degree("dpcp"), machine.topology.per_node
    compute, k = machine.compute, machine.ranks_on_host
    pipe, tp, cp = pipeline_of(cfg, machine, flops_of)
    n = pipe.degree
    tied = tied_s(cfg, vocab, machine)
    other = compute.other_s(dtype, k)
    ends = [other + tied + pipe.end(r) for r in range(n)]
    if tied:
        ends[0] = ends[n - 1] = max(ends[0], ends[n - 1]) + tied
    dp_comm = GroupComm(machine, group_members(p, "dpcp", per_node))
    sharded = p.zero_stage > 0 and dp > 1
    # the engine overlaps the reduce with the rest of the schedule on the replica's communication thread,
    # unless nothing writes a gradient (emulation), overlap is off, or the replica has no second thread
    overlaps = p.overlap and not p.pipeline_emulate_ms and max(p.tensor, p.context, p.expert) == 1
    reduce, exposed, update, gather = [], [], [], []
    for r in range(n):
        owned_params = pipe.parameters_of(r)
        plan = GroupPlan(cfg, vocab, dp, [pipe.shapes[i] for i, _ in owned_params])
        half = p.zero_stage > 0
        seconds = [dp_comm.half(b, reduce=True)[0] if half else dp_comm.all_reduce(b)[0] for b in plan.sizes]
        reduce.append(sum(seconds))
        held = {j for j, (i, _) in enumerate(owned_params)
                if cfg.model.tie_weights and pipe.shapes[i][0] == "wte.weight"}  # summed after the schedule
        if overlaps:  # what outlasts the rest of the rank's schedule is waited for
            ready = bucket_ready(plan.members, [stage for _, stage in owned_params],
                                 final_ends(pipe.schedule, pipe.timeline, r), held, ends[r], other + tied)
            exposed.append(max(0.0, reduce_done(ready, seconds) - ends[r]))
        else:  # after the rank's end, all of it
            exposed.append(reduce[r])
        owned = sum(plan.sizes) // itemsize(dtype) // (dp if sharded else 1)
        update.append(compute.optimizer_s(owned, dtype, k))
        gather.append(sum(dp_comm.half(b, reduce=False)[0] for b in plan.sizes) if sharded else 0.0)
    pp_comm = GroupComm(machine, group_members(p, "pp", per_node))
    flags = 2 if dtype == "fp16" else 0
    agree = pp_comm.scalars(1)[0] + (pp_comm.scalars(flags)[0] if flags else 0.0)
    if sharded:
        agree += dp_comm.scalars(1)[0] + (dp_comm.scalars(flags)[0] if flags else 0.0)
    tp_step = sum(map(tp.seconds, tp.per_step))
    met = max(e + x for e, x in zip(ends, exposed)) + agree + tp_step  # the norm waits for every reduce
    loss = GroupComm(machine).scalars(3)[0]
    step = max(met + u + g for u, g in zip(update, gather)) + loss
    me = pipe.busiest
    tp_s = pipe.per_rank(me, pipe.tp_forward) + pipe.per_rank(me, pipe.tp_backward) + tp_step
    cp_s = pipe.per_rank(me, pipe.cp_forward) + pipe.per_rank(me, pipe.cp_backward)
    busy = pipe.timeline.busy(me) - (tp_s - tp_step) - cp_s  # the rank's compute: TP, CP exposed taken out
    compute_s = other + busy + update[me]
    # the wait for a slower rank scales with what the ranks really compute: not an emulation's sleeps
    imbalance = compute.imbalance_s(other + update[me] if p.pipeline_emulate_ms else compute_s, dtype, k)
    step += imbalance
    ties = 2 * tied if me in (0, n - 1) else 0.0
    comm_s = (pipe.messages(me) * pipe.message_s + ties + reduce[me] + gather[me] + agree + loss + tp_s
              + pipe.per_rank(me, pipe.cp_transfer))
    return StepBreakdown(
        step_s=step, compute_s=compute_s, overlapped_s=reduce[me] - exposed[me], exposed_s=step - compute_s,
        interference_s=0.0, forward_s=pipe.per_rank(me, pipe.forward),
        backward_s=pipe.per_rank(me, pipe.input) + pipe.per_rank(me, pipe.weight),
        recompute_s=pipe.per_rank(me, pipe.recompute), optimizer_s=update[me], comm_s=comm_s,
        imbalance_s=imbalance, algorithm=machine.algorithm, tp_s=tp_s,
        tp=tp.summary(pipe.tp_issued_by(me) + Counter(tp.per_step)), cp_s=cp_s, cp=cp.summary(),
        bubble_s=pipe.bubble_s, p2p_s=pipe.p2p_s,
        pp={**pipe.summary(), "rank": me, "tied_s": tied, "reduce_s": reduce,
              "reduce_exposed_s": exposed, "reduce_overlapped": overlaps, "optimizer_s": update})


def tied_s(cfg, vocab: int, machine: Machine) -> float:
    """One message of the tied weight (V·h) between the first and the last stage (0 when untied)."""
    if not cfg.model.tie_weights:
        return 0.0
    link, _ = neighbour_link(cfg, machine, [(0, cfg.parallel.pipeline - 1)])
    return link.p2p(vocab * cfg.model.n_embd * itemsize(cfg.precision.dtype))
