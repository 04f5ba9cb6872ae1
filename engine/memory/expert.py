"""What a mixture of experts and expert parallelism change in one rank's memory, for the estimator.

Model states. Under expert parallelism (e ranks) a rank holds E/e experts of each MoE layer: their
parameters, gradients and AdamW moments in a buffer of their own (engine.parallel.expert.replica), beside
the data-parallel replica's buffer of everything else, and AdamW's scratch over each (two rows of min(its
piece, optim.CHUNK) elements, both held all run). So the replicated parameters follow the ZeRO table of
estimator.py over the dp group, and the experts' Ψ_x = Ψ_experts / e follow it over the edp group (d = D/e
ranks; stage 0: d = 1): padded to Ψ_x' = ceil(Ψ_x/d)·d, parameters Ψ_x'·s, gradients Ψ_x'·s (stage 2:
Ψ_x'/d·s at rest, Ψ_x'·s from zero_grad to their reduce after backward), master (16-bit) 4Ψ_x'/d, AdamW
m and v Ψ_x'/d each (ExpertStates).

Activations of an MoE block (b rows of s tokens, N = b·s, width C, E experts, top k; f the float size, s'
the element size): in place of the dense MLP's up-projection and GELU outputs (8·N·C·s'), the router's
softmax N·E·s', the top-k renormalisation's chosen probabilities and their sum N·(k+1)·s' (k > 1 only),
the load-balancing loss's f_e (E·s'), and for every row an expert runs on: its input C, its up-projection
output 4C, its GELU output 4C, and its output and weight C + 1 (the combine's product keeps both), 10C + 1
elements each. Rows: N·k with every expert local (dropless); under expert parallelism the rows a rank's
experts run on are those the group dispatched to it, N·k when routing is balanced (the estimate's
assumption: over the EP group they always sum to e·N·k, dropless). A capacity drops rows, so it can only
lower the figure: the estimate is then a bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from itertools import groupby

from engine.dtypes import is_low_precision, itemsize, master_dtype
from engine.memory.estimate_parts import ModelStates
from engine.moe import capacity, is_moe_block
from engine.optim import CHUNK, NORM_CHUNK
from engine.parallel.mesh import Mesh

EXPERTS = ".mlp.experts.mlps."  # in the name of every expert parameter (engine.moe)


def split_shapes(cfg, shapes) -> tuple[list, list]:
    """(the replicated parameters' shapes, this rank's experts' shapes): under expert parallelism a rank
    holds E/e experts of each MoE layer in a buffer of its own; otherwise every parameter is replicated."""
    e = cfg.parallel.expert
    if e == 1:
        return list(shapes), []
    per = cfg.model.n_experts // e
    experts = [row for row in shapes if EXPERTS in row[0]]
    mine = [row for row in experts if int(row[0].split(EXPERTS)[1].split(".")[0]) < per]
    return [row for row in shapes if EXPERTS not in row[0]], mine


@dataclass(frozen=True)
class ExpertStates:
    """This rank's split experts under its ZeRO stage (engine.parallel.expert.replica): `n` elements,
    padded to `padded` (a multiple of the edp ranks their state is sharded over, 1 at stage 0), `owned` of
    them this rank's part (AdamW's piece); `s`, `ms` the bytes of a parameter and of an optimizer element."""

    stage: int
    n: int
    padded: int
    owned: int
    s: int
    ms: int
    low: bool

    @classmethod
    def of(cls, cfg, experts) -> ExpertStates:
        n = sum(math.prod(shape) for _, shape, _ in experts)
        stage, dtype = cfg.parallel.zero_stage, cfg.precision.dtype
        shards = Mesh.of(cfg.parallel).degree("edp") if stage else 1
        padded = -(-n // shards) * shards
        return cls(stage, n, padded, padded // shards, itemsize(dtype), master_dtype(dtype).itemsize,
                   is_low_precision(dtype))

    def states(self) -> dict[str, int]:
        """At rest: the parameters (padded) whole; the gradients whole, or at stage 2 this rank's part;
        the fp32 master (16-bit) and the AdamW moments over the part."""
        return {"parameters": self.s * self.padded,
                "gradients": self.s * (self.owned if self.stage == 2 else self.padded),
                "master": 4 * self.owned if self.low else 0,
                "adam_m": self.ms * self.owned, "adam_v": self.ms * self.owned}

    def step_gradients(self) -> int:
        """Bytes held beside the states from zero_grad to the reduce: stage 2's whole gradient buffer."""
        return self.s * self.padded if self.stage == 2 else 0

    def optimizer_temporaries(self) -> int:
        """The experts' own transient in the optimizer phase: the norm's float64 buffer, or in 16-bit
        the fp32 copy of the owned gradients the update makes, whichever is larger."""
        return max(8 * min(self.owned, NORM_CHUNK), 4 * self.owned if self.low else 0)


def with_expert_states(rest: ModelStates, cfg, experts) -> ModelStates:
    """The replicated parameters' model states `rest` plus this rank's experts' own buffer, its AdamW
    moments and scratch (the data-parallel replica's pieces, which size its norm's buffer, unchanged)."""
    if not experts:
        return rest
    mine = ExpertStates.of(cfg, experts)
    own = mine.states()
    states = {k: v + own.get(k, 0) for k, v in rest.states.items()}
    return replace(rest, states=states, scratch=rest.scratch + 2 * mine.ms * min(mine.owned, CHUNK))


def with_expert_step(timeline, cfg, experts) -> ExpertStates | None:
    """Stage 2's whole expert gradient buffer in `timeline`'s forward and backward (call before replaying
    them); returns the experts' states for expert_optimizer_phase (None without split experts)."""
    if not experts:
        return None
    mine = ExpertStates.of(cfg, experts)
    timeline.base["gradients"] += mine.step_gradients()
    return mine


def expert_optimizer_phase(timeline, mine: ExpertStates | None) -> None:
    """After optimizer_phase: the step buffer gone (reduced at the end of backward), and the temporaries
    the larger of the replicated parameters' and the experts' own (they step one after the other)."""
    if mine is None:
        return
    timeline.base["gradients"] -= mine.step_gradients()
    scratch = timeline.base["temporaries"]
    for figures in {id(f): f for f in (timeline.peaks["optimizer"], timeline.maxima["optimizer"])}.values():
        figures["gradients"] -= mine.step_gradients()
        figures["temporaries"] = max(figures["temporaries"], scratch + mine.optimizer_temporaries())


def routed_rows(cfg, n: int) -> int:
    """Rows per MoE layer and micro-batch of n tokens that a rank sends its experts (its kept choices) and
    that its experts run on, under balanced routing (each rank's tokens choose every expert n·k/E times):
    min(n·k, E·capacity), n·k dropless. Dropless, the rows sent are n·k whatever the router does. Beside
    context parallelism a capacity is decided over the whole sequence (engine.parallel.expert.context), and
    which slice's tokens it drops depends on the routing: n·k, the most a rank can keep (an upper bound)."""
    m = cfg.model
    limit = capacity(n, m.top_k, m.n_experts, m.capacity_factor) if cfg.parallel.context == 1 else None
    return n * m.top_k if limit is None else min(n * m.top_k, m.n_experts * limit)


def exchange_bytes(cfg, n: int, s: int) -> int:
    """One all-to-all's send and receive buffers of an MoE layer under expert parallelism (0 without): the
    rows sent, in expert order, and the rows received, C elements each (engine.parallel.expert.exchange)."""
    return 2 * routed_rows(cfg, n) * cfg.model.n_embd * s if cfg.parallel.expert > 1 else 0


def moe_block_saves(cfg, blocks: list[dict[str, int]], b: int, t: int, s: int) -> list[dict[str, int]]:
    """`blocks` (gpt_saves' per-block arrays) with each MoE block's dense MLP arrays replaced by the
    router's and the experts' (the docstring's list): the expert side's 9C per row it runs on, the combine
    side's C + 1 per row it sent. Under tensor parallelism an expert's up-projection and GELU outputs are
    4C/t a row (its input and output stay whole)."""
    m = cfg.model
    n, c, e, k = b * t, m.n_embd, m.n_experts, m.top_k
    rows = routed_rows(cfg, n)
    t = cfg.parallel.tensor  # each expert's hidden features split t ways (engine.parallel.expert.tensor)
    out = []
    for i, block in enumerate(blocks):
        if is_moe_block(m, i):
            block = {key: v for key, v in block.items() if key not in (f"fc out {i}", f"gelu out {i}")}
            block.update({f"router probs {i}": n * e * s, f"aux f {i}": e * s,
                          f"expert rows {i}": rows * (c + 8 * c // t) * s,
                          f"combine rows {i}": rows * (c + 1) * s})
            if k > 1:
                block[f"top-k renormalised {i}"] = n * (k + 1) * s
        out.append(block)
    return out


def _after_experts(k: int) -> tuple[str, str, str]:
    return f"expert rows {k}", f"combine rows {k}", f"aux f {k}"


def forward_exchanges(timeline, block: dict[str, int], k: int, nbytes: int, phase: str = "forward") -> None:
    """MoE block k's dispatch and combine in forward (`phase` "backward": a checkpointed block's recompute):
    the all-to-all's `nbytes` beside what the block kept before its experts ran, then beside the experts'
    arrays too (call before keeping the whole block)."""
    expert_rows = _after_experts(k)[0]
    timeline.extra["comm_buffers"] += nbytes
    timeline.keep({key: v for key, v in block.items() if key not in _after_experts(k)}, phase)
    timeline.keep({expert_rows: block[expert_rows]}, phase)
    timeline.extra["comm_buffers"] -= nbytes


def backward_exchanges(timeline, k: int, nbytes: int) -> None:
    """MoE block k's two all-to-alls in backward (the combine's mirror, then the dispatch's), before the
    block's arrays are dropped: `nbytes` (the buffers, and ZeRO-2's packs in flight) beside what is held,
    less the combine side's arrays (freed before the first), the experts' (before the second) and every
    layer's f_e (backward frees those first: engine.moe.add_aux_losses)."""
    expert_rows, combine_rows, _ = _after_experts(k)
    aux = [key for key in timeline.held if key.startswith("aux f ")]
    removed: dict[str, int] = {}
    for gone in ([combine_rows, *aux], [expert_rows]):
        removed.update({key: timeline.held.pop(key) for key in gone if key in timeline.held})
        timeline.extra["comm_buffers"] += nbytes
        timeline.mark("backward")
        timeline.extra["comm_buffers"] -= nbytes
    timeline.held.update(removed)  # dropped with their blocks


def experts_in_backward_order(modules: list[list[int]], shapes) -> list[list[int]]:
    """`modules` (parameter indices per module, in the order backward finishes them, as the estimator lists
    them: the last module first) with each MoE layer's experts reordered as backward really finishes them:
    expert 0 first (the combine's backward reaches the experts in expert order), each expert's layers from
    its last (a stable sort). Other modules keep their places."""
    def expert_of(module: list[int]) -> tuple[str | None, int]:  # (its MoE layer, its expert), or (None, 0)
        name = shapes[module[0]][0]
        if EXPERTS not in name:
            return None, 0
        layer, rest = name.split(EXPERTS)
        return layer, int(rest.split(".")[0])

    out: list[list[int]] = []
    for _, run in groupby(modules, key=lambda m: expert_of(m)[0]):  # stable: a run of others stays as is
        out += sorted(run, key=lambda m: expert_of(m)[1])
    return out
