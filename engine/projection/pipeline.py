"""Pipeline parallelism in the step model: each virtual stage's compute per micro-batch, the message between
neighbouring stages on the link the pipeline group uses, and the schedule's own action list played out with
those times by the engine's simulator (engine.parallel.pipeline.simulate) — the list the executor runs, not
a formula. Inert at p = 1: step.py never builds it (its result is unchanged to the bit).

The cut. The blocks are cut into p·v contiguous virtual stages as the engine cuts them (split.py's
balanced_counts over the same weights: parameter elements of the embedding, each block and the head, a tied
head counting its copy); a cut by measured time is projected by FLOPs, the forward time's stand-in.

Compute of one micro-batch on stage s. The whole model's forward takes T_F = FLOPs_F / rate(b·s) and its
backward T_B = 2·FLOPs_F / rate_B(b·s) (compute.py: the calibrated or nominal rate at the micro-batch's
tokens; a stage multiplies products of the same shapes, so it runs at the whole model's rate). The stage
takes its share of the FLOPs (flops.py):

    F_s = T_F · (Σ_{k∈s} block_k + [s last]·head) / FLOPs_F        the embedding's adds count no FLOPs
    B_s = T_B · (Σ_{e∈s} share_e)                                  backward_events' shares on its blocks
                                                                   (the head's on the last stage)
  split for zero-bubble schedules into the input gradient I and the weight gradient W: a Linear's backward
  is two products of equal size (dX = dY·Wᵀ, dW = dYᵀ·X), attention's two products have no weights, so

    W_s = ½ · Σ_{e∈s, e a Linear} share_e · T_B,      I_s = B_s − W_s

  A checkpointed block's recomputed forward (its share of T_F) is added to the backward (to I) of the
  stage holding it. Under tensor parallelism T_F and T_B are the TP rank's (tensor_parallel.py) and each
  stage runs its own blocks' TP collectives inline (exposed), so they are added to its F and I. Under
  context parallelism T_F and T_B are at a rank's b·s/c tokens, and each block adds ring attention's terms
  (context.py, as step.py adds them): its blocks as timed in place of the curve's attention to F and I, its
  hops' exposed part beside them (cp_forward, cp_backward; a checkpointed block's forward hops again in I).

The message. Every stage boundary carries one activation forward and one gradient backward per micro-batch,
each b·s·h elements in the training dtype (s/c under context parallelism, /t under sequence parallelism):
n = b·s·h·itemsize, one point-to-point message, α + n·β (Hockney) on the link between the two neighbours.
The pipeline group is
placed by the mesh (group_comm.py): with the default order tp-cp-ep-dp-pp the pp axis is outermost, its
ranks world/p apart, so once the world exceeds a node every neighbour pair sits on two nodes and the
message takes the inter-node link. A pipeline waits for its slowest hop, so the slowest pair's link is the
one costed (interleaved: the wrap from the last rank back to the first counts too).

The step of the pipeline. simulate(schedule, Durations(F_s, B_s, I_s, W_s, p2p)) gives every action's start
and end on every pipeline rank: its makespan, each rank's busy time and its bubble (idle share of ranks ×
makespan). With equal stages and free messages this is the published bubble, (p−1)/(m+p−1) for GPipe and
1F1B, (p−1)/(v·m+p−1) interleaved, (p−1)/(3m+p−1) for ZB-H1 with F = I = W; uneven stages and P2P
lengthen it as the dependency graph says. `p2p_s` is what the messages add to the makespan (the makespan
with them less the makespan without); stage imbalance is the busiest rank's compute over the mean rank's.

Compute emulation (parallel.pipeline_emulate_ms, the executor's Emulation): each F, I and W sleeps that
long instead of computing (B = I + W), so those are the stage times, whatever the model.

What comes around it (the DP reduce of each chunk from its last weight-gradient action on, overlapped with
the rest of the schedule: pipeline_reduce.py; the tied weight, the agreements, the optimizer per stage) is
pipeline_step.py's.
"""

from __future__ import annotations

import math
from collections import Counter

from engine.dtypes import itemsize
from engine.memory.tensor_parallel import rank_shapes
from engine.parallel.mesh import Mesh
from engine.parallel.pipeline.schedules import build_schedule, formula_bubble
from engine.parallel.pipeline.simulate import Durations, simulate
from engine.parallel.pipeline.split import balanced_counts
from engine.projection.collective_times import Link
from engine.projection.context import ContextParallel
from engine.projection.flops import BackwardEvent, ModelFlops
from engine.projection.machine import Machine
from engine.projection.tensor_parallel import TensorParallel


def stage_blocks(cfg, shapes, flops: ModelFlops) -> list[int]:
    """Blocks per virtual stage, cut as split.py cuts (weights from `shapes`, one rank's parameters)."""
    p, n = cfg.parallel, cfg.model.n_layer

    def numel(prefix: str) -> int:
        return sum(math.prod(s) for name, s, _ in shapes if name.startswith(prefix))
    if p.stage_balance == "params":
        blocks = [float(sum(math.prod(s) for _, s, unit in shapes if unit == k)) for k in range(n)]
        first = float(numel("wte.") + numel("wpe."))
        last = float(numel("ln_f.") + (numel("lm_head.") or numel("wte.")))  # a tied head counts its copy
    else:  # "time" is measured when the run starts; its FLOPs stand in for it here
        blocks, first, last = list(flops.unit_forward), 0.0, flops.forward - sum(flops.unit_forward)
    return balanced_counts(blocks, p.pipeline * p.chunks, first, last)


def stage_of_block(counts: list[int]) -> list[int]:
    """The virtual stage holding each block."""
    return [s for s, n in enumerate(counts) for _ in range(n)]


def neighbour_link(cfg, machine: Machine, hops: list[tuple[int, int]] | None = None) -> tuple[Link, str]:
    """The link of the slowest hop between pipeline ranks (default: neighbours; interleaved also wraps from
    the last rank to the first), and its name."""
    mesh, per_node = Mesh.of(cfg.parallel), machine.topology.per_node
    if hops is None:
        wrap = [(mesh.pp - 1, 0)] if cfg.parallel.chunks > 1 else []
        hops = [(i, i + 1) for i in range(mesh.pp - 1)] + wrap
    crosses = any(mesh.rank_of(dp=d, pp=a, cp=c, tp=t) // per_node != mesh.rank_of(dp=d, pp=b, cp=c, tp=t)
                  // per_node for d in range(mesh.dp) for c in range(mesh.cp) for t in range(mesh.tp)
                  for a, b in hops)
    topo = machine.topology
    return (topo.inter, "inter-node") if crosses else (topo.intra, "intra-node")


class Pipeline:
    """The pipeline term of one config on one machine: stage times, the message, the simulated step.
    `seconds`: (T_F, T_B, recomputed block forward) of one micro-batch of the whole model on a rank."""

    def __init__(self, cfg, vocab: int, rows: int, machine: Machine, flops: ModelFlops,
                 events: list[BackwardEvent], seconds: tuple[float, float, float], ckpt: set,
                 tp: TensorParallel, cp: ContextParallel):
        p, m = cfg.parallel, cfg.model
        self.degree, self.chunks, self.micro = p.pipeline, p.chunks, cfg.train.micro_batches
        self.shapes = rank_shapes(cfg, vocab)
        self.counts = stage_blocks(cfg, self.shapes, flops)
        self.schedule = build_schedule(p.schedule, p.pipeline, self.micro, p.chunks)
        seq = m.block_size // p.context // (p.tensor if p.sequence_parallel else 1)  # a rank's tokens a row
        self.message_bytes = rows * seq * m.n_embd * itemsize(cfg.precision.dtype)
        self.link, self.link_name = neighbour_link(cfg, machine)
        self.message_s = self.link.p2p(self.message_bytes)
        # per virtual stage, one micro-batch: the compute of F, I and W, a checkpointed block's recomputed
        # forward (run in I), and the TP collectives inside F and inside the backward
        self.forward, self.input, self.weight = ([0.0] * len(self.counts) for _ in range(3))
        self.recompute, self.tp_forward, self.tp_backward = ([0.0] * len(self.counts) for _ in range(3))
        self.tp_issued: list[Counter] = [Counter() for _ in self.counts]  # per stage and micro-batch
        # CP's ring hops inside F and the backward, the part the blocks do not hide, and all they move
        self.cp_forward, self.cp_backward, self.cp_transfer = ([0.0] * len(self.counts) for _ in range(3))
        self._stage_seconds(flops, events, seconds, ckpt, tp)
        self._ring(cp, ckpt)
        if emulated := p.pipeline_emulate_ms / 1000:  # every F, I and W sleeps this long instead (executor)
            stages = len(self.counts)
            self.forward, self.input, self.weight = ([emulated] * stages for _ in range(3))
            self.recompute, self.tp_forward, self.tp_backward = ([0.0] * stages for _ in range(3))
            self.cp_forward, self.cp_backward, self.cp_transfer = ([0.0] * stages for _ in range(3))
        self.play()

    def play(self) -> None:
        """Simulate the schedule's action list with these times (again, after a change to them), and once
        more with free messages."""
        self.timeline = simulate(self.schedule, self.durations(self.message_s))
        self.free = simulate(self.schedule, self.durations(0.0))

    def _stage_seconds(self, flops: ModelFlops, events: list[BackwardEvent], seconds: tuple[float, ...],
                       ckpt: set, tp: TensorParallel) -> None:
        t_fwd, t_bwd, t_block = seconds
        where, last = stage_of_block(self.counts), len(self.counts) - 1

        def issue(times: list[float], stage: int, collectives: list) -> None:
            times[stage] += sum(map(tp.seconds, collectives))
            self.tp_issued[stage].update(collectives)

        issue(self.tp_forward, 0, tp.embedding_forward)
        for k, f in enumerate(flops.unit_forward):
            self.forward[where[k]] += t_fwd * f / flops.forward
            issue(self.tp_forward, where[k], tp.unit_forward.get(k, []))
        self.forward[last] += t_fwd * (flops.forward - sum(flops.unit_forward)) / flops.forward
        issue(self.tp_forward, last, tp.head_forward)
        for event in events:
            s = last if event.layer == "head" else 0 if event.block is None else where[event.block]
            part = event.share * t_bwd
            half = 0.0 if event.layer in ("attention", "embeddings") else part / 2  # dW of a Linear
            self.weight[s] += half
            self.input[s] += part - half
            key = (event.block, event.layer)
            issue(self.tp_backward, s, tp.before.get(key, []) + tp.after.get(key, []))
        for k in ckpt:
            self.recompute[where[k]] += t_block
            issue(self.tp_backward, where[k], tp.unit_forward.get(k, []))

    def _ring(self, cp: ContextParallel, ckpt: set) -> None:
        """Under context parallelism each block's attention is the ring's (context.py, as step.py counts
        it): its blocks as timed in place of the curve's attention (compute, in F and I) and its hops' exposed
        part (in F and I beside the TP collectives; a checkpointed block's recomputed forward hops again)."""
        if not cp.active:
            return
        for k, stage in enumerate(stage_of_block(self.counts)):
            recomputed = k in ckpt
            self.forward[stage] += cp.extra_forward_s
            self.input[stage] += cp.extra_backward_s + (cp.extra_forward_s if recomputed else 0.0)
            self.cp_forward[stage] += cp.block_forward_s
            self.cp_backward[stage] += cp.block_backward_s + (cp.block_forward_s if recomputed else 0.0)
            self.cp_transfer[stage] += (cp.block_forward_transfer_s * (2 if recomputed else 1)
                                        + cp.block_backward_transfer_s)

    def stage_s(self) -> tuple[list[float], list[float], list[float]]:
        """Per virtual stage, one micro-batch: F, I and W as the schedule runs them (TP collectives, CP's
        exposed hops and a checkpointed block's recompute included)."""
        forward = [f + c + h for f, c, h in zip(self.forward, self.tp_forward, self.cp_forward)]
        inputs = [i + r + c + h for i, r, c, h in zip(self.input, self.recompute, self.tp_backward,
                                                      self.cp_backward)]
        return forward, inputs, list(self.weight)

    def durations(self, p2p: float) -> Durations:
        forward, inputs, weight = self.stage_s()
        return Durations(forward, [i + w for i, w in zip(inputs, weight)], inputs, weight, p2p)

    def per_rank(self, rank: int, values: list[float]) -> float:
        """A per-stage figure summed over `rank`'s stages and the step's micro-batches."""
        return self.micro * sum(values[s] for s in self.schedule.stages_of(rank))

    def tp_issued_by(self, rank: int) -> Counter:
        """The TP collectives `rank`'s stages issue in the step's micro-batches, counted."""
        issued: Counter = Counter()
        for s in self.schedule.stages_of(rank):
            issued.update({c: n * self.micro for c, n in self.tp_issued[s].items()})
        return issued

    def end(self, rank: int) -> float:
        """When pipeline rank `rank`'s last action ends."""
        return max((s.end for s in self.timeline.spans[rank]), default=0.0)

    def messages(self, rank: int) -> int:
        return sum(not s.action.op.is_compute for s in self.timeline.spans[rank])

    def stage_names(self, rank: int) -> list[str]:
        """The parameters of `rank`'s stages (a tied head's copy is no parameter of the replica's)."""
        return [self.shapes[i][0] for i, _ in self.parameters_of(rank)]

    def parameters_of(self, rank: int) -> list[tuple[int, int]]:
        """(index in `shapes`, virtual stage) of each parameter of `rank`'s stages, in the model's order."""
        where, out = stage_of_block(self.counts), []
        mine = set(self.schedule.stages_of(rank))
        last = len(self.counts) - 1
        for i, (name, _, unit) in enumerate(self.shapes):
            outside = last if name.startswith(("ln_f.", "lm_head.")) else 0  # the head's, or the embedding's
            stage = where[unit] if unit is not None else outside
            if stage in mine:
                out.append((i, stage))
        return out

    @property
    def busiest(self) -> int:
        return max(range(self.degree), key=self.timeline.busy)

    @property
    def imbalance(self) -> float:
        """The busiest pipeline rank's compute over the mean rank's (1: balanced)."""
        busy = [self.timeline.busy(r) for r in range(self.degree)]
        return max(busy) / (sum(busy) / len(busy)) if sum(busy) else 1.0

    @property
    def bubble_s(self) -> float:
        """The mean pipeline rank's idle seconds within the pipeline's makespan."""
        return self.timeline.bubble * self.timeline.makespan

    @property
    def p2p_s(self) -> float:
        """What the messages add to the pipeline's makespan."""
        return self.timeline.makespan - self.free.makespan

    def summary(self) -> dict:
        s = self.schedule
        formula, published = formula_bubble(s.name, s.ranks, s.micro_batches, s.chunks)
        return {"degree": self.degree, "schedule": s.name, "chunks": self.chunks, "micro_batches": self.micro,
                "blocks_per_stage": list(self.counts), "link": self.link_name,
                "message_bytes": self.message_bytes, "message_s": self.message_s,
                "messages_per_rank": max(self.messages(r) for r in range(self.degree)),
                "stage_forward_s": self.stage_s()[0],
                "stage_backward_s": [i + w for i, w in zip(*self.stage_s()[1:])],
                "makespan_s": self.timeline.makespan, "bubble": self.timeline.bubble,
                "bubble_formula": formula, "bubble_published": published, "bubble_s": self.bubble_s,
                "p2p_s": self.p2p_s, "stage_imbalance": self.imbalance}

