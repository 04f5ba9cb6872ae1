"""The analytic memory estimator: per-rank bytes by category, from the config alone.

It is kept apart from the measuring ledger (engine.memory.ledger) on purpose: tests hold the two together.

Model states (Ψ parameters, N ranks, s bytes per element of the training dtype; master weights,
Adam m and v are fp32, or fp64 in fp64 training). Stages 1-2 pad the flat buffer to Ψp =
ceil(Ψ/N)·N and a rank owns Ψp/N of it; stage 3 pads every unit (each block, plus the parameters
outside the blocks) to a multiple of N, so its shard Ψ3 = Σ ceil(Ψ_unit/N):

| category   | stage 0 | stage 1 | stage 2 | stage 3 |
|------------|---------|---------|---------|---------|
| parameters | Ψ·s     | Ψp·s    | Ψp·s    | Ψ3·s    |
| gradients  | Ψ·s     | Ψp·s    | Ψp/N·s  | Ψ3·s    |
| master     | 4Ψ      | 4Ψp/N   | 4Ψp/N   | 4Ψ3     |  (fp16/bf16 only; fp32/fp64 update in place)
| adam_m, v  | 4Ψ each | 4Ψp/N   | 4Ψp/N   | 4Ψ3     |

For 2-byte training that is the ZeRO paper's table (16Ψ, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N) up to
padding, and it counts every byte: the original nanoDist table left the fp32 master weights out.
Hybrid sharding (`parallel.hybrid`) shards inside a node only: N above is then the node's G =
`parallel.ranks_per_node` ranks (padding to multiples of G), while the micro-batch still splits over
all N ranks.

Temporaries: the AdamWs of a rank's pieces (stage 0: everything; 1-2: its part of each bucket; 3: its
part of each unit) share one scratch array, held for the whole run: two rows of min(largest piece,
optim.CHUNK) elements of the master dtype. The optimizer step adds an fp32 copy of the owned gradients
in mixed precision; before it, the gradient norm passes through one float64 buffer of min(largest
piece, optim.NORM_CHUNK) elements.

Transients (engine.parallel.data): stages 2 and 3 hold each parameter's p.grad array from the moment its
gradient is final until the bucket (stage 3: the unit) it belongs to is packed into a buffer for the
reduce-scatter; the buffer is held until the rank retires it, with two in flight at most (one with
overlap off). `_gradient_flow` replays that exactly: gradients become final module by module from the
last (each module's parameters in their own order), the embeddings last of all (their op ran first);
buckets launch in order once complete, units as they complete; every micro-batch repeats it. Stage 3
also gathers the outer unit plus one block (two with prefetch) of parameters.

Activations: what nanoDist's ops list in `saved=` (per rank and micro-batch of B sequences of T
tokens, width C, H heads, vocabulary V, global batch G; f = 4 bytes, 8 in fp64), per GPT block
    LayerNorm x2: input BTC·s + mean and 1/std 2·BT·f each     c_attn input BTC·s
    q, k, v (views of one array) 3BTC·s    attention output BTC·s, which is c_proj's input (one array),
    and log-sum-exp BHT·f (flash attention keeps no [T, T] probabilities)
    MLP: fc input BTC·s, GELU input 4BTC·s, proj input 4BTC·s
    with dropout: 1-byte masks 2·BTC (attention redraws its mask in backward)
i.e. 16·BTC·s + BHT·f + 4·BT·f (compare Korthikanti et al.: sbh(34 + 5as/h) bytes at s = 2);
outside the blocks: the token ids (the global batch array, G·T·8), final LayerNorm, the head's
input, the logits BTV·s, log-sum-exp BT·f and the targets (G·T·8). With checkpointing a recomputed
block keeps only its input BTC·s; in backward one block at a time is recomputed in full. The peak
is found by replaying that order (forward, then backward from the last block). Under context parallelism
every activation is over the rank's own s/c tokens, and each block's ring holds its keys and values (and
their gradients backward) in flight while its attention runs (engine.memory.context).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine.config.build import count_params, param_shapes, vocab_size
from engine.dtypes import itemsize, master_dtype
from engine.memory.context import ContextSplit, attention_part, before_attention
from engine.memory.estimate_parts import (
    MemoryEstimate,
    Timeline,
    gpt_saves,
    model_states,
    optimizer_phase,
    shard_count,
)
from engine.memory.expert import (
    backward_exchanges,
    exchange_bytes,
    expert_optimizer_phase,
    experts_in_backward_order,
    forward_exchanges,
    moe_block_saves,
    split_shapes,
    with_expert_states,
    with_expert_step,
)
from engine.memory.pipeline import estimate_ranks
from engine.memory.tensor_parallel import (
    TensorSplit,
    rank_shapes,
    row_parallel_modules,
    sequence_region_numel,
)
from engine.moe import is_moe_block
from engine.parallel.data.buckets import aligned_buckets
from engine.parallel.data.flat import FlatLayout
from engine.parallel.mesh import Mesh
from engine.recompute import checkpointed_blocks


def estimate(cfg, vocab: int | None = None) -> MemoryEstimate:
    """Per-rank memory of training `cfg`. `vocab` overrides looking it up (0 = from the data). Under tensor
    parallelism every rank of the mesh holds the same bytes (engine.memory.tensor_parallel); under pipeline
    parallelism the ranks differ by stage, and this is the heaviest pipeline rank's estimate
    (engine.memory.pipeline.estimate_ranks gives each)."""
    if cfg.parallel.pipeline > 1:
        return max(estimate_ranks(cfg, vocab), key=lambda e: sum(e.peak()[1].values()))
    dtype = cfg.precision.dtype
    micro = cfg.train.global_batch // (Mesh.of(cfg.parallel).dp * cfg.train.micro_batches)
    vocab = (vocab or vocab_size(cfg)) if cfg.model.kind == "gpt" else 0
    # this rank's: its tensor-parallel shards, and apart from them its split experts (engine.memory.expert)
    shapes, experts = split_shapes(cfg, rank_shapes(cfg, vocab))
    rest = with_expert_states(model_states(cfg, shapes), cfg, experts)
    timeline = Timeline(rest.states, rest.scratch)
    step_experts = with_expert_step(timeline, cfg, experts)
    _replay(timeline, cfg, vocab, micro, _transients(shapes, cfg, rest.units))
    if region := sequence_region_numel(cfg, shapes) * itemsize(dtype):  # SP's gradient sum, after backward
        timeline.extra.update(gradients=0, comm_buffers=region)
        timeline.mark("backward")
    optimizer_phase(timeline, cfg, rest)
    expert_optimizer_phase(timeline, step_experts)
    n_params = count_params(param_shapes(cfg, vocab))  # the whole model's
    return MemoryEstimate(n_params, cfg.parallel.world_size, cfg.parallel.zero_stage, dtype,
                          cfg.memory.checkpointing, micro, rest.states, timeline.peaks, timeline.maxima)


# ---------------------------------------------------------------------- one micro-batch, replayed

@dataclass(frozen=True)
class _Transients:
    """Bytes of what ZeRO gathers and packs in flight (0 where a stage does not)."""

    outer: int = 0  # stage 3: the gathered outer unit (embeddings, final LayerNorm), padded
    block: int = 0  # stage 3: one gathered block, padded
    prefetch: bool = False
    block_grads: int = 0  # stage 3: one block's p.grad arrays
    grads: int = 0  # stages 2-3: the most p.grad bytes held at once (_gradient_flow)
    buffers: int = 0  # stages 2-3: the most packed buffer bytes held at once
    # stages 2-3: packed bytes in flight as each block's attention backward starts (when a context-parallel
    # ring holds its buffers too), by block
    at_attention: tuple[int, ...] = ()
    # stage 2: packed bytes in flight as each MoE block's all-to-alls run in backward (expert parallelism)
    at_exchange: dict = field(default_factory=dict)


def _transients(shapes, cfg, units: list[int]) -> _Transients:
    s, stage = itemsize(cfg.precision.dtype), cfg.parallel.zero_stage
    if stage not in (2, 3):
        return _Transients()
    grads, buffers, at_attention, at_exchange = _gradient_flow(shapes, cfg)
    if stage == 2:
        return _Transients(grads=grads, buffers=buffers, at_attention=at_attention, at_exchange=at_exchange)
    numel: dict = {}
    for _, shape, unit in shapes:
        numel[unit] = numel.get(unit, 0) + math.prod(shape)
    blocks = [numel[u] for u in numel if u is not None] or [0]
    return _Transients(outer=units[0] * s, block=max(units[1:], default=0) * s,
                       prefetch=cfg.parallel.prefetch, block_grads=max(blocks) * s, grads=grads,
                       buffers=buffers, at_attention=at_attention)


def ready_order(shapes, bias_first: frozenset[str] = frozenset()) -> list[int]:
    """Parameter indices in the order backward makes their gradients final: modules from the last one
    back, each module's parameters in their own order (a Linear's weight, then its bias; for the modules
    in `bias_first`, row-parallel layers, the bias first: it is added after the reduce, so its gradient
    comes out before the product's), and the embeddings (wte, wpe: their lookup ran first, and the tied
    wte also serves the head) last."""
    modules: list[list[int]] = []
    for i, (name, _, _) in enumerate(shapes):
        module = name.rpartition(".")[0]
        if modules and shapes[modules[-1][0]][0].rpartition(".")[0] == module:
            modules[-1].append(i)
        else:
            modules.append([i])
    modules = [m[::-1] if shapes[m[0]][0].rpartition(".")[0] in bias_first else m for m in modules]
    embeddings = [m for m in modules if shapes[m[0]][0].rpartition(".")[0] in ("wte", "wpe")]
    rest = [m for m in modules if m not in embeddings]
    return [i for m in experts_in_backward_order(rest[::-1], shapes) + embeddings for i in m]


def _gradient_flow(shapes, cfg) -> tuple[int, int, tuple[int, ...], dict]:
    """(most p.grad bytes, most packed-buffer bytes) a stage-2 or stage-3 rank holds at once in backward, and
    the packed bytes in flight as each block's attention backward starts (its output projection's gradients
    final; none without overlap, as the measured ranks show), by replaying engine.parallel.data.zero12 /
    zero3: a parameter's p.grad counts from when it is final until the last bucket (unit) holding it is
    packed; buckets pack in order once complete, units as they complete; a packed buffer counts until a
    later pack retires it (two in flight at most, one without overlap) or backward ends. Also the packed
    bytes in flight as each MoE block's all-to-alls run in backward (before its router's gradient is final),
    by block."""
    s, world, stage = itemsize(cfg.precision.dtype), shard_count(cfg), cfg.parallel.zero_stage
    sizes = [math.prod(shape) * s for _, shape, _ in shapes]
    if stage == 2:
        layout = FlatLayout([(name, shape) for name, shape, _ in shapes], cfg.precision.dtype, world)
        buckets = aligned_buckets(layout, int(cfg.parallel.bucket_cap_mb * 2**20), world)
        groups = [list(b.members) for b in buckets]
        group_bytes = [(b.end - b.start) * s for b in buckets]
    else:
        keys = [None] + sorted({u for _, _, u in shapes if u is not None})
        groups = [[i for i, (_, _, u) in enumerate(shapes) if u == key] for key in keys]
        groups = [g for g in groups if g]
        group_bytes = [math.ceil(sum(sizes[i] for i in g) / (s * world)) * world * s for g in groups]
    of_param: list[list[int]] = [[] for _ in shapes]
    for g, members in enumerate(groups):
        for i in members:
            of_param[i].append(g)
    held = most_held = 0
    packed: list[int] = []  # buffer bytes in the order packed, over every micro-batch
    order = ready_order(shapes, row_parallel_modules(cfg, shapes))
    attention = {shapes[i][2]: pos for pos, i in enumerate(order) if ".attn.c_proj." in shapes[i][0]}
    at_attention = dict.fromkeys(attention, 0)
    gates = {shapes[i][2]: pos for pos, i in enumerate(order) if ".mlp.router.gate." in shapes[i][0]}
    at_exchange = dict.fromkeys(gates, 0)
    for _ in range(cfg.train.micro_batches):
        ready, left, done, next_bucket = [0] * len(groups), [len(of) for of in of_param], set(), 0
        first = len(packed)  # this micro-batch's first pack
        for pos, i in enumerate(order):
            for unit in (u for u, at in gates.items() if at == pos and cfg.parallel.overlap):
                at_exchange[unit] = max(at_exchange[unit], sum(packed[first:][-2:]))
            held += sizes[i]
            most_held = max(most_held, held)
            for g in of_param[i]:
                ready[g] += 1
            complete = [g for g in range(len(groups)) if ready[g] == len(groups[g]) and g not in done]
            if stage == 2:  # in bucket order only
                complete = []
                while next_bucket < len(groups) and ready[next_bucket] == len(groups[next_bucket]):
                    complete.append(next_bucket)
                    next_bucket += 1
            for g in complete:
                done.add(g)
                packed.append(group_bytes[g])
                for j in groups[g]:
                    left[j] -= 1
                    held -= sizes[j] if left[j] == 0 else 0
            for unit in (u for u, at in attention.items() if at == pos and cfg.parallel.overlap):
                at_attention[unit] = max(at_attention[unit], sum(packed[first:][-2:]))
    flights = tuple(at_attention[u] for u in sorted(at_attention))
    if not cfg.parallel.overlap:
        return most_held, max(packed), flights, at_exchange
    return most_held, max([packed[0]] + [a + b for a, b in zip(packed, packed[1:])]), flights, at_exchange


def _replay(t: Timeline, cfg, vocab: int, micro: int, z: _Transients) -> None:
    """Forward, then backward from the last block, as the trainer and the replicas run them."""
    m, dtype = cfg.model, cfg.precision.dtype
    s, f, g = itemsize(dtype), master_dtype(dtype).itemsize, cfg.train.global_batch
    split = TensorSplit.of(cfg)
    if m.kind == "mlp":  # one group; stage 3 gathers the layers, taken as co-occurring (an upper bound)
        t.extra["parameters"] = z.outer + (1 + z.prefetch) * z.block
        t.keep(_mlp_saves(m.widths, micro, g, s, f, m.dropout, split.t), "forward")
        t.mark("backward")
        t.extra.update(parameters=0, gradients=z.grads, comm_buffers=z.buffers)
        t.drop(list(t.held))
        t.mark("backward")
        return
    cp = ContextSplit.of(cfg)  # a context-parallel rank keeps its own tokens' arrays (engine.memory.context)
    ring_forward, ring_backward = cp.ring_buffers(cfg, micro)
    embedding, *blocks, head = gpt_saves(micro, cp.tokens(m.block_size), m.n_embd, m.n_head, vocab, m.n_layer,
                                         cp.id_rows(g, micro), s, f, m.dropout, split)
    blocks = moe_block_saves(cfg, blocks, micro, cp.tokens(m.block_size), s)
    ckpt = set(checkpointed_blocks(cfg.memory.checkpointing, m.n_layer))
    exchange = exchange_bytes(cfg, micro * cp.tokens(m.block_size), s)  # each all-to-all's, under EP
    exchanging = {k for k in range(len(blocks)) if exchange and is_moe_block(m, k)}
    loss = {k: head.pop(k) for k in ("logits", "lse", "targets")}  # kept by the loss, after the model
    last = len(blocks) - 1
    t.extra["parameters"] = z.outer + z.prefetch * z.block  # stage 3: outer unit, block 0 prefetched
    t.keep(embedding, "forward")
    for k, block in enumerate(blocks):
        ahead = z.prefetch * z.block * (k < last)
        t.extra["parameters"] = z.outer + z.block + ahead
        kept = {next(iter(block)): next(iter(block.values()))} if k in ckpt else block
        if ring_forward:  # the ring's keys and values in flight, once ln_1 and the QKV product kept theirs
            t.extra["comm_buffers"] = ring_forward
            t.keep(before_attention(kept, k), "forward")
            t.extra["comm_buffers"] = 0
        if k in exchanging and k in ckpt:  # the same all-to-alls, the forward keeping nothing of the block
            t.extra["comm_buffers"] = exchange
            t.mark("forward")
            t.extra["comm_buffers"] = 0
        elif k in exchanging:  # the dispatch's and the combine's buffers, while the experts run
            forward_exchanges(t, kept, k, exchange)
        t.keep(kept, "forward")
        t.extra["parameters"] = z.outer + ahead
    t.keep(head, "forward")
    t.extra["parameters"] = 0
    t.keep(loss, "forward")
    t.mark("backward")
    t.drop([name for name in t.held if name.startswith("aux f ")])  # the load-balancing terms' ops run first
    t.drop(loss)
    t.extra["parameters"] = z.outer + z.prefetch * z.block  # gathered again at the logits
    t.mark("backward")
    t.drop(head)
    for k in reversed(range(len(blocks))):
        behind = z.prefetch * z.block * (k > 0)
        t.extra["parameters"] = z.outer + z.block + behind
        if k in ckpt:  # recomputed in full while everything before it is held (its all-to-alls too, under EP)
            if k in exchanging:
                forward_exchanges(t, blocks[k], k, exchange, "backward")
            t.keep(blocks[k], "backward")
        if ring_backward:  # the ring's keys, values and their gradients, once the MLP's arrays are freed
            t.drop([name for name in blocks[k] if name not in attention_part(blocks[k], k)])
            t.extra["comm_buffers"] = ring_backward + (z.at_attention[k] if z.at_attention else 0)
            t.mark("backward")
            t.extra["comm_buffers"] = 0
        if k in exchanging:
            backward_exchanges(t, k, exchange + z.at_exchange.get(k, 0))
        t.drop(blocks[k])
        t.extra.update(gradients=z.block_grads, comm_buffers=z.block)  # the block's gradients packed
        t.mark("backward")
        t.extra.update(parameters=z.outer + behind, gradients=0, comm_buffers=0)
    t.drop(embedding)
    t.extra.update(gradients=z.grads, comm_buffers=z.buffers)  # the most held at once (the last pack, often)
    t.mark("backward")


def _mlp_saves(widths, b, g, s, f, p, t: int = 1) -> dict[str, int]:
    """An MLP's kept arrays; under tensor parallelism the hidden layers a column-parallel layer makes
    (every other one, from the first) hold 1/t of their features."""
    saves = {"input": b * widths[0] * s, "logits": b * widths[-1] * s, "lse": b * f, "targets": g * 8}
    for i, w in enumerate(widths[1:-1]):
        w //= t if i % 2 == 0 else 1
        saves.update({f"pre-gelu {i}": b * w * s, f"next input {i}": b * w * s})
        if p:
            saves[f"mask {i}"] = b * w
    return saves


# ---------------------------------------------------------------------- choosing a bucket size

BUCKET_CAPS_MB = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0, 2.0, 4.0, 8.0, 16.0, 25.0)  # candidates, MiB


def bucket_cap_for_memory(cfg, tolerance: float = 0.01) -> float:
    """The bucket cap a user after the lowest peak picks: the largest of BUCKET_CAPS_MB whose estimated
    peak total is within `tolerance` of the lowest any of them reaches. Smaller buckets shrink the
    gradients and buffers in flight, until another phase (the optimizer step, usually) sets the peak;
    below that point they only add collectives."""
    from engine.config import replace
    peaks = {cap: sum(estimate(replace(cfg, "parallel.bucket_cap_mb", cap)).peak()[1].values())
             for cap in BUCKET_CAPS_MB}
    lowest = min(peaks.values())
    return max(cap for cap, peak in peaks.items() if peak <= lowest * (1 + tolerance))
