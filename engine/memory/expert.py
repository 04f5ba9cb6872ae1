"""What a mixture of experts and expert parallelism change in one rank's memory, for the estimator.

Model states. Under expert parallelism (e ranks) a rank holds E/e experts of each MoE layer: their
parameters, gradients and AdamW moments in a buffer of their own (engine.parallel.expert.replica), beside
the data-parallel replica's buffer of everything else, and AdamW's scratch over each (two rows of min(its
size, optim.CHUNK) elements, both held all run). So the replicated parameters follow the ZeRO table of
estimator.py (stage 0: EP runs DDP) and the experts add Ψ_experts / e to every state.

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
from dataclasses import replace
from itertools import groupby

from engine.dtypes import itemsize, master_dtype
from engine.memory.estimate_parts import ModelStates
from engine.moe import is_moe_block
from engine.optim import CHUNK

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


def with_expert_states(rest: ModelStates, cfg, experts) -> ModelStates:
    """The replicated parameters' model states `rest` plus this rank's experts' own buffer, its AdamW
    moments and scratch (the data-parallel replica's pieces, which size the norm's buffer, unchanged)."""
    n = sum(math.prod(shape) for _, shape, _ in experts)
    if not n:
        return rest
    s, ms = itemsize(cfg.precision.dtype), master_dtype(cfg.precision.dtype).itemsize
    own = {"parameters": s * n, "gradients": s * n, "adam_m": ms * n, "adam_v": ms * n}
    states = {k: v + own.get(k, 0) for k, v in rest.states.items()}
    return replace(rest, states=states, scratch=rest.scratch + 2 * ms * min(n, CHUNK))


def moe_block_saves(cfg, blocks: list[dict[str, int]], b: int, t: int, s: int) -> list[dict[str, int]]:
    """`blocks` (gpt_saves' per-block arrays) with each MoE block's dense MLP arrays replaced by the
    router's and the experts' (the docstring's list)."""
    m = cfg.model
    n, c, e, k = b * t, m.n_embd, m.n_experts, m.top_k
    out = []
    for i, block in enumerate(blocks):
        if is_moe_block(m, i):
            block = {key: v for key, v in block.items() if key not in (f"fc out {i}", f"gelu out {i}")}
            block.update({f"router probs {i}": n * e * s, f"aux f {i}": e * s,
                          f"expert rows {i}": n * k * (10 * c + 1) * s})
            if k > 1:
                block[f"top-k renormalised {i}"] = n * (k + 1) * s
        out.append(block)
    return out


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
