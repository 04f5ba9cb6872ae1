"""The parameters one rank of a tensor-parallel group holds: engine.config.build.param_shapes with every
sharded weight cut as the plan cuts it (engine.parallel.tensor.plan, through its ShardSpec), from the
config alone — the buckets, units and optimizer shards the step model sends are built over these.

    GPT   attn.c_attn     column-parallel, q, k and v each split   weight [3C/t, C], bias [3C/t]
          attn.c_proj     row-parallel                             weight [C, C/t], bias [C] whole
          mlp.layers.0    column-parallel                          weight [4C/t, C], bias [4C/t]
          mlp.layers.1    row-parallel                             weight [C, 4C/t], bias [C] whole
          wte (lm_head)   vocabulary rows, padded to a multiple of t   [ceil(V/t), C]
          wpe, LayerNorms whole
    MLP   layers 2i, 2i+1 a column-, then a row-parallel pair

Names, order and units are the dense model's, so indices into one list are indices into the other.
"""

from __future__ import annotations

import math

from engine.config.build import param_shapes
from engine.parallel.tensor.slicing import ShardSpec

# (layer, the axis its weight is split along, sections): the GPT blocks' parallel layers
_GPT_LAYERS = (("attn.c_attn", 0, 3), ("attn.c_proj", 1, 1), ("mlp.layers.0", 0, 1), ("mlp.layers.1", 1, 1))


def _cut(shape: tuple, axis: int, t: int, sections: int = 1) -> tuple:
    spec = ShardSpec(axis=axis, length=shape[axis], parts=t, sections=sections)
    return shape[:axis] + (spec.sections * spec.local_section,) + shape[axis + 1:]


def _split(name: str, shape: tuple, cfg, t: int) -> tuple:
    """One parameter's shape on a rank of the group."""
    module, _, kind = name.rpartition(".")
    if cfg.model.kind == "mlp":
        index = int(module.rpartition(".")[2])
        column = index % 2 == 0
        if kind == "bias":
            return _cut(shape, 0, t) if column else shape
        return _cut(shape, 0 if column else 1, t)
    if module in ("wte", "lm_head"):
        return _cut(shape, 0, t)
    layer = module.partition(".")[2].partition(".")[2]  # "blocks.3.attn.c_attn" -> "attn.c_attn"
    for parallel, axis, sections in _GPT_LAYERS:
        if layer == parallel:
            if kind == "bias":  # a column layer's bias is cut with its outputs; a row layer's is whole
                return _cut(shape, 0, t, sections) if axis == 0 else shape
            return _cut(shape, axis, t, sections)
    return shape


def rank_param_shapes(cfg, vocab: int) -> list[tuple[str, tuple, int | None]]:
    """(name, shape on one rank of the tensor-parallel group, unit), in param_shapes' order."""
    shapes = param_shapes(cfg, vocab)
    t = cfg.parallel.tensor
    if t == 1:
        return shapes
    return [(name, _split(name, shape, cfg, t), unit) for name, shape, unit in shapes]


def sequence_region(cfg, vocab: int) -> int:
    """Elements of the replicated parameters inside the sequence-parallel region (the LayerNorms and the
    row-parallel biases): under SP their gradients are summed over the group once per step."""
    if cfg.model.kind != "gpt":
        return 0
    rows = ("ln_1.", "ln_2.", "ln_f.", "attn.c_proj.bias", "mlp.layers.1.bias")
    total = 0
    for name, shape, _ in param_shapes(cfg, vocab):
        if any(part in name for part in rows):
            total += math.prod(shape)
    return total
