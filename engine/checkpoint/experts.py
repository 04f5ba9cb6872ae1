"""Checkpoints across expert-parallel degrees: the dense model's flat state split into what an expert-parallel
rank holds, and joined back from what every rank saved.

Under expert parallelism (e ranks, E experts) a rank holds two flat states (engine.parallel.expert.replica):
the *replicated* parameters (every parameter but the experts', in the dense order) on its data-parallel
replica, and its *held* experts r·E/e ... (r+1)·E/e − 1 of every MoE layer in a buffer of their own (the dense
order restricted to those experts: layer by layer, expert by expert). Both orders follow from the parameter
names alone (an expert's parameters are named `...mlp.experts.mlps.<j>....`), so a checkpoint stores each
part as it is held, the manifest naming which global experts each shard holds, and consolidating interleaves
them back into the dense layout. A run of any expert degree (1 too) then cuts its own parts out again.

    replicated_numel(layout)            elements of the replicated part
    held_numel(layout, lo, hi)          elements of experts lo..hi-1 (every MoE layer's)
    split(layout, flat, lo, hi)         the dense flat array -> (replicated part, experts lo..hi-1)
    join(layout, replicated, held)      the replicated part, [(lo, hi, part)] of every expert -> dense
"""

from __future__ import annotations

import math

import numpy as np

EXPERT_NAME = ".mlp.experts.mlps."  # in the name of every expert's parameter (engine.moe)
EXPERT_KEYS = {"master": "expert_master", "m": "expert_m", "v": "expert_v"}  # a shard's arrays of its experts


def expert_of(name: str) -> int | None:
    """The global expert a parameter belongs to, or None for a replicated parameter."""
    if EXPERT_NAME not in name:
        return None
    return int(name.split(EXPERT_NAME, 1)[1].split(".", 1)[0])


def _spans(layout: list[dict]) -> list[tuple[int | None, int, int]]:
    """(expert or None, start, end) of every parameter in the dense flat array."""
    out, start = [], 0
    for slot in layout:
        end = start + math.prod(slot["shape"])
        out.append((expert_of(slot["name"]), start, end))
        start = end
    return out


def replicated_numel(layout: list[dict]) -> int:
    return sum(end - start for e, start, end in _spans(layout) if e is None)


def held_numel(layout: list[dict], lo: int, hi: int) -> int:
    return sum(end - start for e, start, end in _spans(layout) if e is not None and lo <= e < hi)


def split(layout: list[dict], flat: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """(the replicated parameters' part, experts lo..hi-1's part) of a dense flat array, each in the order
    its rank holds it."""
    spans = _spans(layout)
    rest = [flat[a:b] for e, a, b in spans if e is None]
    held = [flat[a:b] for e, a, b in spans if e is not None and lo <= e < hi]
    return (np.concatenate(rest) if rest else flat[:0].copy(),
            np.concatenate(held) if held else flat[:0].copy())


def join(layout: list[dict], replicated: np.ndarray, held: list[tuple[int, int, np.ndarray]]) -> np.ndarray:
    """The dense flat array from the replicated part and parts (lo, hi, array) of experts that together
    cover every expert once; the inverse of split."""
    spans = _spans(layout)
    out = np.empty(spans[-1][2] if spans else 0, replicated.dtype)
    at = 0
    cursor = {lo: 0 for lo, _, _ in held}
    owner = {}
    for lo, hi, _ in held:
        owner.update(dict.fromkeys(range(lo, hi), lo))
    parts = {lo: part for lo, _, part in held}
    for e, a, b in spans:
        n = b - a
        if e is None:
            out[a:b] = replicated[at:at + n]
            at += n
        else:
            lo = owner[e]
            out[a:b] = parts[lo][cursor[lo]:cursor[lo] + n]
            cursor[lo] += n
    return out
