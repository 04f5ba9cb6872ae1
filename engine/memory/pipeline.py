"""What pipeline parallelism changes in a rank's memory, for the estimator: per pipeline rank, by its stages.

Model states. Pipeline rank r holds the parameters of its stages (engine.parallel.pipeline.split: the cut
by parameter count; a cut by measured time is made at launch and cannot be predicted, so the estimate takes
the parameter cut for it too), laid out by its replica as any model's (the ZeRO table in
engine.memory.estimator over the rank's own parameters; ZeRO 0 or 1, the stages PP allows). The last stage
also holds the tied head's copy of wte (parameters), and its gradient from the stage's first weight
gradient to the end of the schedule.

Activations. A micro-batch's stage s keeps, from its F to its B, the arrays its layers save (the
estimator's per-block list, cut at the stage's blocks: the embedding's on stage 0, the final LayerNorm,
logits and loss on the last; the token ids and the targets are views of one global batch array, held once
however many micro-batches keep them). How many micro-batches are in flight is read off the schedule's own
action list (engine.parallel.pipeline.schedules), walking rank r's actions: each F adds its stage's bytes,
each B frees them, and the peak of the rank's total is taken (interleaved stages differ in size). That walk
gives the published bounds: GPipe m, 1F1B min(p - r, m), interleaved Megatron's warm-up; ZB-H1 1F1B's from
F to I, and more until W (below). With activation checkpointing a recomputed block keeps its input only,
and its B recomputes it in full, one block at a time. Phases, as the executor books them: each F in
"forward", each B, I and W in "backward" (a phase's peak is the highest of the moments of its actions, from
what each starts with), the data-parallel reduce's end in "backward" and the update in "optimizer".

Zero bubble. I frees what only the input gradient needs; until W a stage keeps the inputs of its weight
products (engine.backward_split: a node whose weight product waits keeps its saves): per block ln_1's and
ln_2's outputs, attention's output and GELU's, and on the last stage ln_f's output; and what the weight half
itself holds: each Linear's output gradient (per block 3 + 1 + 4 + 1 b·s·h, /t for the column-parallel
ones, whole sequences under SP, fp32 under 16-bit training; the logits' on the last stage), the
LayerNorms' finished gradients (and under TP the row-parallel biases'). Stage 0 has no input gradient to
make, so its I runs nothing and it keeps everything, and the gradient it was seeded with, until W.

The executor (communication buffers). Each message is one b × s × h array of the compute dtype (s/t under
sequence parallelism, which also sums the LayerNorm region's partial gradients after the backwards): a
received activation from its receive (its batch's post) until its F reads it, a stage's output until its
batch is waited for, a received gradient until its B reads it, an input gradient until its batch is waited
for — the executor's waits (engine.parallel.pipeline.waits: at the latest one compute action after the post).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine.config.build import count_params, param_shapes, vocab_size
from engine.dtypes import itemsize, master_dtype
from engine.memory.context import ContextSplit, own_token_ids
from engine.memory.estimate_parts import (
    MemoryEstimate,
    Timeline,
    gpt_saves,
    model_states,
    optimizer_phase,
)
from engine.memory.expert import (
    expert_optimizer_phase,
    moe_block_saves,
    split_shapes,
    with_expert_states,
    with_expert_step,
)
from engine.memory.pipeline_experts import with_exchanges
from engine.memory.pipeline_rings import stage_rings
from engine.memory.tensor_parallel import TensorSplit, rank_shapes, sequence_region_numel
from engine.parallel.mesh import Mesh
from engine.parallel.pipeline.ir import Op
from engine.parallel.pipeline.schedules import build_schedule
from engine.parallel.pipeline.split import balanced_counts
from engine.parallel.pipeline.waits import wait_plan
from engine.recompute import checkpointed_blocks

SHARED = ("idx", "targets")  # views of the global batch: one array whatever the micro-batches in flight
WEIGHT_INPUTS = ("ln_1 out", "attn O", "ln_2 out", "gelu out", "ln_f out")  # kept from I to W


def stage_counts(cfg, shapes) -> list[int]:
    """Blocks per virtual stage: split_model's cut by parameter count, from the rank's own shapes."""
    weights = [0.0] * (cfg.model.n_layer + 2)  # embedding, blocks, head
    for name, shape, unit in shapes:
        slot = 1 + unit if unit is not None else (0 if name.startswith(("wte.", "wpe.")) else -1)
        weights[slot] += math.prod(shape)
    if cfg.model.tie_weights:
        weights[-1] += math.prod(next(shape for name, shape, _ in shapes if name == "wte.weight"))
    stages = cfg.parallel.pipeline * cfg.parallel.chunks
    return balanced_counts(weights[1:-1], stages, weights[0], weights[-1])


def estimate_ranks(cfg, vocab: int | None = None) -> list[MemoryEstimate]:
    """One estimate per pipeline rank (rank r of the pipeline group, any data- or tensor-parallel rank)."""
    p, dtype, m = cfg.parallel, cfg.precision.dtype, cfg.model
    vocab = vocab or vocab_size(cfg)
    micro = cfg.train.global_batch // (Mesh.of(p).dp * cfg.train.micro_batches)
    shapes = rank_shapes(cfg, vocab)
    counts = stage_counts(cfg, shapes)
    firsts = [sum(counts[:i]) for i in range(len(counts))]
    s, f = itemsize(dtype), master_dtype(dtype).itemsize
    cp = ContextSplit.of(cfg)  # a context-parallel rank's arrays are over its s/c tokens (memory.context)
    embedding, *blocks, head = gpt_saves(micro, cp.tokens(m.block_size), m.n_embd, m.n_head, vocab, m.n_layer,
                                         cp.id_rows(cfg.train.global_batch, micro), s, f, m.dropout,
                                         TensorSplit.of(cfg))
    blocks = moe_block_saves(cfg, blocks, micro, cp.tokens(m.block_size), s)  # MoE blocks: router, experts
    groups = own_token_ids([embedding, *blocks, head], cp.c)
    ckpt = set(checkpointed_blocks(cfg.memory.checkpointing, m.n_layer))
    schedule = build_schedule(p.schedule, p.pipeline, cfg.train.micro_batches, p.chunks)
    last = schedule.stages - 1
    wte = math.prod(next(shape for name, shape, _ in shapes if name == "wte.weight")) * s
    copy = wte if m.tie_weights else 0  # the last stage's own copy of a tied wte
    split = TensorSplit.of(cfg)
    io = micro * cp.tokens(m.block_size) // split.region * m.n_embd * s  # b × s × h (s/c under CP, /t SP)
    row_bias = m.n_embd * s if m.bias and p.tensor > 1 else 0
    weight_half = _Held(max(s, 4) // s, (1 + m.bias) * m.n_embd * s, row_bias, io)
    out = []
    for rank in range(p.pipeline):
        held = schedule.stages_of(rank)
        mine = [(n, sh, u) for n, sh, u in shapes if _stage_of(n, u, firsts) in held
                and not (n == "lm_head.weight" and m.tie_weights)]
        replicated, experts = split_shapes(cfg, mine)  # under EP, the stages' split experts apart
        rest = with_expert_states(model_states(cfg, replicated), cfg, experts)
        states = {**rest.states, "parameters": rest.states["parameters"] + copy * (last in held)}
        timeline = Timeline(states, rest.scratch)
        step_experts = with_expert_step(timeline, cfg, experts)
        stages = {i: _stage_bytes(groups, firsts[i], counts[i], i == 0, i == last, ckpt, weight_half,
                                  cp.ring_buffers(cfg, micro)) for i in held}
        stages = {i: with_exchanges(st, cfg, micro * cp.tokens(m.block_size), s, groups, firsts[i], counts[i],
                                    i == 0, ckpt, _size) for i, st in stages.items()}  # EP's all-to-alls
        _walk(timeline, schedule.actions[rank], stages, io, copy * (last in held), last)
        timeline.mark("backward")  # finish_backward: the gradients' reduce, in place (DDP, ZeRO-1)
        if region := sequence_region_numel(cfg, mine) * s:  # then SP's sum of the partial gradients
            timeline.extra["comm_buffers"] = region
            timeline.mark("backward")
        optimizer_phase(timeline, cfg, rest)
        expert_optimizer_phase(timeline, step_experts)
        out.append(MemoryEstimate(count_params(param_shapes(cfg, vocab)), p.world_size, p.zero_stage, dtype,
                                  cfg.memory.checkpointing, micro, states, timeline.peaks, timeline.maxima,
                                  pipeline_rank=rank, stages=tuple(held)))
    return out


def _stage_of(name: str, unit: int | None, firsts: list[int]) -> int:
    if unit is not None:
        return max(i for i, first in enumerate(firsts) if first <= unit)
    return 0 if name.startswith(("wte.", "wpe.")) else len(firsts) - 1


@dataclass(frozen=True)
class _StageBytes:
    """One stage's bytes per micro-batch: kept from F to B or I (`forward`, and the `shared` global-batch
    views), kept from I to W (`weight`, `weight_shared`), and the most one micro-batch holds while its B,
    I or W recomputes a checkpointed block (0: none; `recompute_shared`, what of `shared` is held then)."""

    forward: int
    shared: dict
    weight: int
    weight_shared: dict
    during_b: int = 0
    during_i: int = 0
    during_w: int = 0
    recompute_shared: dict = field(default_factory=dict)
    rings: dict = field(default_factory=dict)  # under CP: each action's ring moments (memory.pipeline_rings)
    head_input: int = 0  # last stage: the head's weight product's input, freed before its gradient lands


def _weight_part(group: dict) -> dict:
    return {k: v for k, v in group.items() if k.rsplit(" ", 1)[0] in WEIGHT_INPUTS or k == "ln_f out"}


def _size(group: dict) -> int:
    return sum(v for k, v in group.items() if k not in SHARED)


@dataclass(frozen=True)
class _Held:
    """What a split backward's weight half holds besides saved arrays (engine.backward_split): each Linear's
    output gradient (`widen`: its bytes per element over the activations', fp32 under 16-bit training), each
    LayerNorm's finished gradients (`ln` bytes), under tensor parallelism each row-parallel layer's bias
    gradient (`row_bias`: the bias is added after the reduce, by its own op), and on stage 0, which has no
    input gradient to make, the received gradient it was seeded with (`seed`)."""

    widen: int
    ln: int
    row_bias: int
    seed: int

    def block(self, group: dict, b: int) -> int:  # c_attn's, c_proj's, the MLP's two; ln_1's and ln_2's
        # the row-parallel products' outputs are whole (b·s·h, the ln_1 output's size), before SP scatters
        # an MoE block has no fc out: its experts' weight half is not modelled (there, a lower bound)
        products = group[f"qkv {b}"] + group.get(f"fc out {b}", 0) + 2 * group[f"ln_1 out {b}"]
        return self.widen * products + 2 * self.ln + 2 * self.row_bias


def _stage_bytes(groups, first: int, n: int, embedding: bool, head: bool, ckpt: set, h: _Held,
                 ring_buffers: tuple[int, int] = (0, 0)) -> _StageBytes:
    emb, top = (groups[0] if embedding else {}), (groups[-1] if head else {})
    full = groups[1 + first:1 + first + n]
    reduced = [dict(list(g.items())[:1]) if first + j in ckpt else g for j, g in enumerate(full)]
    # after I, a block keeps its weight products' inputs and what h counts; a checkpointed one the
    # recompute's (its nested backward is split too, and reports its half at its own end) and its own input,
    # which its checkpoint node keeps until W
    weights = [{**(reduced[j] if first + j in ckpt else {}), **_weight_part(g), f"grads {first + j}":
                h.block(g, first + j)} for j, g in enumerate(full)]
    head_weight = {**_weight_part(top), **({"grads head": h.widen * top["logits"] + h.ln} if head else {})}
    during_b = during_i = 0
    for j in range(n):  # B and I run from the last block; block j, checkpointed, is recomputed in full
        if first + j in ckpt:
            below = _size(emb) + sum(_size(r) for r in reduced[:j])
            during_b = max(during_b, below + _size(full[j]))
            after = sum(_size(w) - (first + j + 1 + k not in ckpt) * h.block(g, first + j + 1 + k)
                        for k, (w, g) in enumerate(zip(weights[j + 1:], full[j + 1:])))  # blocks done
            after += _size(_weight_part(top))  # the outer half reports at its end
            during_i = max(during_i, below + max(_size(full[j]), _size(weights[j])) + after)
    kept = {**emb, **{k: v for r in reduced for k, v in r.items()}, **top}
    shared = {k: v for k, v in kept.items() if k in SHARED}
    rings = stage_rings(ring_buffers, first, emb, full, reduced, ckpt, _size, weights, head_weight, h.seed,
                        embedding)
    if embedding:  # nothing on stage 0 needs an input gradient: I runs nothing, W is all of B
        during_w = during_b + h.seed if during_b else 0
        return _StageBytes(_size(kept), shared, _size(kept) + h.seed, shared, during_b, 0, during_w, shared,
                           rings)
    weight = {**{k: v for w in weights for k, v in w.items()}, **head_weight}
    return _StageBytes(_size(kept), shared, _size(weight), {}, during_b, during_i,
                       rings=rings, head_input=top.get("ln_f out", 0))  # targets: freed by I


def _walk(t: Timeline, actions, stages: dict[int, _StageBytes], io: int, copy: int, last: int) -> None:
    """Rank's actions in order, as the executor runs them, each in its phase (a forward's "forward", a B, I
    or W's "backward", from its start, with the waits before it and the batches posted after it):
    activations in flight, the executor's buffers, the tied copy's gradient."""
    forwarded = dict.fromkeys(stages, 0)  # micro-batches between F and B (or I)
    weighted = dict.fromkeys(stages, 0)  # between I and W

    def mark(running: int = 0, running_shared: dict | None = None) -> None:
        """`running`, `running_shared`: what the micro-batch being run holds (it is in no count meanwhile)."""
        shared = dict(running_shared or {})
        for i, st in stages.items():
            shared.update(st.shared if forwarded[i] else {})
            shared.update(st.weight_shared if weighted[i] else {})
        t.held = {"in flight": running + sum(shared.values()) + sum(
            forwarded[i] * st.forward + weighted[i] * st.weight for i, st in stages.items())}
        t.mark(phase)

    def ring(st: _StageBytes, op: str) -> None:  # inside the action: each block's ring (CP), its buffers
        for running, buffers in st.rings.get(op, ()):
            t.extra["comm_buffers"] += buffers
            mark(running)
            t.extra["comm_buffers"] -= buffers

    def messages(k: int, ops: tuple) -> int:  # batch k's bytes of these ops
        return io * sum(actions[b].op in ops for b in plan.batches[k])

    def post(batches) -> None:  # every receive buffer allocated; the sends held until the batch is waited for
        for k in batches:
            t.extra["comm_buffers"] += messages(k, (Op.RECV_ACT, Op.RECV_GRAD))
            mark()

    def wait(batches) -> None:  # what they sent is freed; what they received is handed on (already counted)
        for k in batches:
            t.extra["comm_buffers"] -= messages(k, (Op.SEND_ACT, Op.SEND_GRAD))

    plan = wait_plan(actions)
    posted = waited = 0
    phase = "forward"
    for j, i in enumerate(plan.computes):
        a = actions[i]
        phase = "forward" if a.op == Op.FORWARD else "backward"  # the executor's: the action's
        mark()  # what the phase starts with
        post(range(posted, plan.posted[j]))  # (only before the first action: the others are posted below)
        posted = plan.posted[j]
        wait(range(waited, plan.done[j]))
        waited = plan.done[j]
        st, s = stages[a.stage], a.stage
        if a.op == Op.FORWARD:
            t.extra["comm_buffers"] -= io * (s > 0)  # the received input, read (the tape keeps it)
            ring(st, "F")
            forwarded[s] += 1
            mark()
            t.extra["comm_buffers"] += io * (s < last)  # the output, until its batch is waited for
        elif a.op in (Op.BACKWARD, Op.BACKWARD_INPUT):
            t.extra["comm_buffers"] -= io * (s < last)  # the received gradient, read
            forwarded[s] -= 1
            mark(st.forward, st.shared)
            if s == last and a.op == Op.BACKWARD:  # the head's weight gradient comes first: the copy's
                t.extra["gradients"] = copy
            if a.op == Op.BACKWARD and st.during_b:
                mark(st.during_b, st.recompute_shared)
            elif a.op == Op.BACKWARD_INPUT and st.during_i:
                mark(st.during_i)
            ring(st, "B" if a.op == Op.BACKWARD else "I")
            weighted[s] += a.op == Op.BACKWARD_INPUT
            t.extra["comm_buffers"] += io * (s > 0)  # the input gradient, until its batch is waited for
        else:  # W: the head's weight product first, its node freed, then the copy's gradient; then the rest
            weighted[s] -= 1
            mark(st.weight, st.weight_shared)
            if s == last and copy:
                t.extra["gradients"] = copy
                mark(st.weight - st.head_input, st.weight_shared)
            if st.during_w:
                mark(st.during_w, st.recompute_shared)
            ring(st, "W")
        mark()
        following = plan.posted[j + 1] if j + 1 < len(plan.computes) else len(plan.batches)
        post(range(posted, following))  # the batches after the action, in its phase
        posted = following
    wait(range(waited, len(plan.batches)))
    phase = "backward"
    mark()  # the step's gradient work begins (pipeline.step): the tied copy's gradient still held
    t.extra["gradients"] = 0  # summed into the first stage's wte and dropped
