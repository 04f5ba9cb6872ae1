"""Which parameters the plan cuts, and how, from their dense names and shapes alone (no model, no group).

The estimator (per-rank bytes), checkpoints (joining every tensor-parallel rank's shards into the dense
arrays, and cutting them again for any degree) and the schema that checks a checkpoint's shards all need
the plan's cut without building a model; plan.py makes the same cut on a live model (the tests hold the
two equal). A parameter not listed stays whole on every rank (LayerNorms, position embeddings, the
row-parallel layers' biases).

    GPT  wte.weight, lm_head.weight           rows (the vocabulary), padded to a multiple of t
         blocks.i.attn.c_attn.weight, .bias   rows, as three sections: q, k, v each by heads
         blocks.i.attn.c_proj.weight          columns (input features)
         blocks.i.mlp.layers.0.weight, .bias  rows (the 4h hidden features)
         blocks.i.mlp.layers.1.weight         columns
         blocks.i.mlp.experts.mlps.e.layers.* each expert's MLP as the dense one (parallel/expert/tensor.py)
    MLP  layers.(2k).weight, .bias            rows (column-parallel)
         layers.(2k+1).weight                 columns (row-parallel)
"""

from __future__ import annotations

import re

from engine.parallel.tensor.slicing import ShardSpec

_GPT = [(re.compile(r"^(wte|lm_head)\.weight$"), 0, 1),
        (re.compile(r"\.attn\.c_attn\.(weight|bias)$"), 0, 3),
        (re.compile(r"\.attn\.c_proj\.weight$"), 1, 1),
        (re.compile(r"\.mlp\.layers\.0\.(weight|bias)$"), 0, 1),
        (re.compile(r"\.mlp\.layers\.1\.weight$"), 1, 1),
        (re.compile(r"\.mlp\.experts\.mlps\.\d+\.layers\.0\.(weight|bias)$"), 0, 1),  # as the MLP's
        (re.compile(r"\.mlp\.experts\.mlps\.\d+\.layers\.1\.weight$"), 1, 1)]
_MLP_LAYER = re.compile(r"^layers\.(\d+)\.(weight|bias)$")


def _cut(kind: str, name: str) -> tuple[int, int] | None:
    """(axis, sections) of a parameter the plan cuts, None for one it keeps whole."""
    if kind == "gpt":
        return next(((axis, sections) for pattern, axis, sections in _GPT if pattern.search(name)), None)
    match = _MLP_LAYER.match(name)
    if match is None:
        return None
    column = int(match.group(1)) % 2 == 0
    if column:
        return 0, 1
    return (1, 1) if match.group(2) == "weight" else None


def shard_specs(kind: str, shapes, t: int) -> dict[str, ShardSpec]:
    """name -> ShardSpec of every parameter the plan cuts t ways, of a `kind` ("gpt" | "mlp") model whose
    parameters are `shapes` [(name, dense shape), ...]; {} for t = 1 (nothing is cut)."""
    if t == 1:
        return {}
    specs = {}
    for name, shape in shapes:
        cut = _cut(kind, name)
        if cut is not None:
            axis, sections = cut
            specs[name] = ShardSpec(axis=axis, length=shape[axis], parts=t, sections=sections)
    return specs


def local_shapes(kind: str, shapes, t: int) -> list[tuple[str, tuple[int, ...]]]:
    """[(name, the shape each rank holds)] in the given order: shards padded as the plan pads them."""
    specs = shard_specs(kind, shapes, t)
    return [(name, specs[name].local_shape(tuple(shape)) if name in specs else tuple(shape))
            for name, shape in shapes]
