"""A context-parallel pipeline stage's rings, for the estimator's walk of a schedule (engine.memory.pipeline).

Each block's attention runs its ring (engine.parallel.context) inside the stage's actions: forward inside F,
backward inside B (1F1B, GPipe, interleaved), inside I (zero bubble: attention's backward makes the input's
gradient), or inside W on stage 0 (whose I runs nothing). While a ring runs it holds its keys and values in
flight (engine.memory.context.ContextSplit.ring_buffers: communication buffers), beside what the running
micro-batch keeps at that moment. These are the moments the walk marks inside an action, one per block:

    F  block j's ring     the stage's input's embedding (stage 0), blocks before j as kept, block j's
                          input and ln_1's (before_attention; nothing of a checkpointed block, whose
                          forward runs without a tape and keeps its input once it ends)
    B  block j's ring     the blocks before j as kept, block j's attention part (its MLP's and c_proj's
                          arrays freed; a checkpointed block recomputed, then freed down to the same)
    I  block j's ring     as B, with the inputs of the weight products deferred so far: every later
                          block's and the head's, and block j's MLP's (the gradients the weight halves
                          hold are reported when I ends, after its rings; a checkpointed block's, when
                          its own nested split backward ends)
    W  (stage 0)          as B, and the gradient the stage was seeded with

A recomputed block's forward ring inside B holds less of everything than its backward ring after it, so
only the backward's is marked. At context degree 1 there are no rings and no moments.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.memory.context import attention_part, before_attention

Group = dict[str, int]


def _saves(weight: Group) -> Group:
    """What of a weight half the tape keeps during I: the products' inputs; the gradients it holds are
    reported when I ends (engine.backward_split), after every ring of the action."""
    return {n: v for n, v in weight.items() if not n.startswith("grads")}


def stage_rings(rings: tuple[int, int], first: int, emb: Group, full: list[Group], reduced: list[Group],
                ckpt: set, size: Callable[[Group], int], weights: list[Group], head_weight: Group,
                seed: int, embedding: bool) -> dict[str, tuple[tuple[int, int], ...]]:
    """{"F", "B", "I", "W"}: (bytes the running micro-batch holds, ring bytes in flight) at each block's ring,
    from the stage's per-block groups (`full` as saved, `reduced` as kept under checkpointing, `weights` as
    held from I to W) and `rings` = (forward, backward) buffer bytes; none when `rings` is (0, 0)."""
    forward, backward = rings
    if not forward:
        return {}
    f, b, i, w = [], [], [], []
    for j, group in enumerate(full):
        k = first + j
        below = size(emb) + sum(size(r) for r in reduced[:j])
        # a checkpointed block's forward keeps nothing (no tape) until it ends, its input included
        f.append((below + (0 if k in ckpt else size(before_attention(group, k))), forward))
        at_attention = below + size(attention_part(group, k))
        b.append((at_attention, backward))
        w.append((at_attention + seed, backward))
        mine = {**attention_part(group, k), **_saves(weights[j])}
        # a later checkpointed block's nested split backward reported its held gradients at its own end
        later = sum(size(x if first + j + 1 + n in ckpt else _saves(x))
                    for n, x in enumerate(weights[j + 1:]))
        i.append((below + size(mine) + later + size(_saves(head_weight)), backward))
    if embedding:  # stage 0's I runs nothing: its backward, rings and all, is W's
        return {"F": tuple(f), "B": tuple(b), "W": tuple(w)}
    return {"F": tuple(f), "B": tuple(b), "I": tuple(i)}
