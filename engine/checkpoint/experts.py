"""Checkpoints of expert-parallel runs: what a rank holds, as runs of the whole model's flat state.

Under expert parallelism (e ranks, E experts) a rank holds two flat states (engine.parallel.expert.replica):
the *replicated* parameters (every parameter of its stages but the split experts', in the dense order) on its
data-parallel replica, ZeRO owning a part of them, and its *held* experts r·E/e ... (r+1)·E/e − 1 of every
MoE layer of its stages in a buffer of their own. Neither is one run of the whole model's flat state (an MoE
layer's experts sit between blocks; a rank holds E/e of them), but each is a sequence of parameters the
names say (an expert's are `...mlp.experts.mlps.<j>....`), so each maps onto *runs*, [start, end) ranges of
the whole model's flat state in the dense order (under tensor parallelism, of this rank's tensor-parallel
coordinate's: shapes local, engine.checkpoint.reshard). A shard lists its runs; the runs of a coordinate's
shards tile its flat state, so a checkpoint consolidates to the dense model's arrays whatever expert, data,
tensor or pipeline degree saved it, and a rank of any layout gathers its parameters' values back by name.

    offsets(kind, layout, t)                 name -> (start, size) in a coordinate's flat state
    runs(params, offsets, a, b)              the runs elements [a, b) of a flat buffer of `params` cover
    gather(flat, params, offsets)            a flat buffer of `params`' values from a coordinate's flat state
    expert_of(name)                          the global expert a parameter is (None: replicated)
"""

from __future__ import annotations

import math

import numpy as np

from engine.checkpoint.reshard import local_layout

EXPERT_NAME = ".mlp.experts.mlps."  # in the name of every expert's parameter (engine.moe)


def expert_of(name: str) -> int | None:
    """The global expert a parameter belongs to, or None for a replicated parameter."""
    if EXPERT_NAME not in name:
        return None
    return int(name.split(EXPERT_NAME, 1)[1].split(".", 1)[0])


def offsets(kind: str, layout: list[dict], t: int) -> dict[str, tuple[int, int]]:
    """Parameter name -> (start, size) in the flat state of one tensor-parallel coordinate of `t` (the dense
    model's at t = 1), in the dense order."""
    out, start = {}, 0
    for name, shape, _ in local_layout(kind, layout, t):
        size = math.prod(shape)
        out[name] = (start, size)
        start += size
    return out


def runs(params: list[tuple[str, int]], where: dict[str, tuple[int, int]], a: int, b: int
         ) -> list[list[int]]:
    """The runs of the flat state that elements [a, b) of a flat buffer of `params` ((name, size), packed in
    order) are, adjacent runs merged."""
    out: list[list[int]] = []
    at = 0
    for name, size in params:
        lo, hi = max(a, at), min(b, at + size)
        if lo < hi:
            start = where[name][0] + lo - at
            if out and out[-1][1] == start:
                out[-1][1] = start + hi - lo
            else:
                out.append([start, start + hi - lo])
        at += size
    return out


def gather(flat: np.ndarray, params: list[tuple[str, int]], where: dict[str, tuple[int, int]]) -> np.ndarray:
    """The flat buffer of `params` (name, size), packed in order, taken from a coordinate's flat state."""
    parts = [flat[where[name][0]:where[name][0] + size] for name, size in params]
    return np.concatenate(parts) if parts else flat[:0].copy()
