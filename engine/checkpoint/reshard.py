"""Checkpoints across tensor-parallel degrees: the shards every tensor-parallel rank saved, joined into the
dense model's arrays, and the dense arrays cut again for one rank of any degree.

A rank of a tensor-parallel run saves its own flat state (fp32 master, m, v) in its own layout: the dense
parameter order, each sharded parameter as this rank's shard (engine.parallel.tensor.specs says which and
how, from names and shapes alone; a vocabulary padded to a multiple of t). Consolidating joins the t
coordinates' states parameter by parameter (ShardSpec.unshard, padding dropped), so a checkpoint reads as
the same dense arrays whatever degree saved it: `export` writes them, and a resumed run of any degree cuts
its own rank's part back out (ShardSpec.shard, padding zero, as the plan pads). Padding rows never get a
gradient, so they stay zero: cutting what was joined gives back the bits that were saved, and a run resumed
at its own degree continues bitwise.

    join(kind, layout, t, locals)   [every coordinate's flat array] -> the dense flat array
    cut(specs, rank, layout, flat)  the dense flat array -> one coordinate's flat array ({} specs: itself)
"""

from __future__ import annotations

import math

import numpy as np

from engine.parallel.tensor import ShardSpec, shard_specs


def _shapes(layout: list[dict]) -> list[tuple[str, tuple[int, ...]]]:
    return [(slot["name"], tuple(slot["shape"])) for slot in layout]


Slot = tuple[str, tuple[int, ...], ShardSpec | None]


def local_layout(kind: str, layout: list[dict], t: int) -> list[Slot]:
    """(name, the shape each coordinate holds, its ShardSpec or None) of every parameter, in layout order."""
    specs = shard_specs(kind, _shapes(layout), t)
    return [(name, specs[name].local_shape(shape) if name in specs else shape, specs.get(name))
            for name, shape in _shapes(layout)]


def local_numel(kind: str, layout: list[dict], t: int) -> int:
    """Elements of one coordinate's flat state (padding of the vocabulary included)."""
    return sum(math.prod(shape) for _, shape, _ in local_layout(kind, layout, t))


def join(kind: str, layout: list[dict], t: int, locals_: list[np.ndarray]) -> np.ndarray:
    """The dense flat array (layout order, unpadded) from every coordinate's flat array (coordinate order)."""
    parts, start = [], 0
    for _, shape, spec in local_layout(kind, layout, t):
        end = start + math.prod(shape)
        shards = [flat[start:end].reshape(shape) for flat in locals_]
        parts.append((shards[0] if spec is None else spec.unshard(shards)).reshape(-1))
        start = end
    return np.concatenate(parts) if parts else np.zeros(0)


def cut(specs: dict[str, ShardSpec], rank: int, layout: list[dict], flat: np.ndarray) -> np.ndarray:
    """Coordinate `rank`'s flat array from the dense one, under `specs` (the rank's layout's; none: the
    dense array itself)."""
    if not specs:
        return flat
    parts, start = [], 0
    for name, shape in _shapes(layout):
        end = start + math.prod(shape)
        dense = flat[start:end].reshape(shape)
        parts.append(specs[name].shard(dense, rank).reshape(-1) if name in specs else dense.reshape(-1))
        start = end
    return np.concatenate(parts)
