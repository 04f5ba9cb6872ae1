"""A pipeline stage's expert-parallel all-to-alls, for the estimator's walk of a schedule
(engine.memory.pipeline), as pipeline_rings.py gives it a context-parallel stage's rings.

Each MoE block of the stage exchanges its rows inside the stage's actions: the dispatch and the combine
inside F, their mirrors inside B (1F1B, GPipe, interleaved). While one runs, its send and receive buffers
(engine.memory.expert.exchange_bytes: communication buffers) sit beside what the running micro-batch keeps
at that moment, the moments engine.memory.expert's forward_exchanges and backward_exchanges mark without a
pipeline:

    F  block j's dispatch   the stage's input's embedding (stage 0), blocks before j as kept, block j's
                            arrays up to its experts
       block j's combine    and the experts' rows
    B  block j's combine'   the blocks before j as kept and block j, less its combine side's arrays and the
                            load-balancing terms' f_e (freed first)
       block j's dispatch'  and less the experts' rows

Zero-bubble schedules (I and W) are not modelled for MoE blocks: their I holds at least what B does here,
which is marked for it (a lower bound). Without expert parallelism, or in a checkpointed block (its
exchanges run again inside the recompute), no moments.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from engine.memory.expert import exchange_bytes
from engine.moe import is_moe_block

Group = dict[str, int]


def with_exchanges(stage, cfg, tokens: int, s: int, groups: list[Group], first: int, n: int, embedding: bool,
                   ckpt: set, size: Callable[[Group], int]):
    """`stage` (pipeline._StageBytes) with its MoE blocks' exchange moments added to its `rings`."""
    nbytes = exchange_bytes(cfg, tokens, s)
    if not nbytes:
        return stage
    emb = groups[0] if embedding else {}
    full = groups[1 + first:1 + first + n]
    reduced = [dict(list(g.items())[:1]) if first + j in ckpt else g for j, g in enumerate(full)]
    f, b = [], []
    for j, group in enumerate(full):
        k = first + j
        if not is_moe_block(cfg.model, k) or k in ckpt:
            continue
        rows, combine = group[f"expert rows {k}"], group[f"combine rows {k}"]
        below = size(emb) + sum(size(r) for r in reduced[:j])
        before = below + size(group) - rows - combine - group[f"aux f {k}"]
        f += [(before, nbytes), (before + rows, nbytes)]
        aux = sum(v for r in [*reduced[:j], group] for name, v in r.items() if name.startswith("aux f "))
        after_combine = below + size(group) - combine - aux
        b += [(after_combine, nbytes), (after_combine - rows, nbytes)]
    rings = dict(stage.rings)
    for op, moments in (("F", f), ("B", b), ("I", b)):
        rings[op] = tuple(rings.get(op, ())) + tuple(moments)
    return replace(stage, rings=rings)
