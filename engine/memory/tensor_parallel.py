"""What tensor (and sequence) parallelism changes in one rank's memory, for the estimator.

Model states: a rank holds its shard of every parameter the plan cuts (engine.parallel.tensor.specs: the
attention and MLP matrices by 1/t, the vocabulary's rows padded to ceil(V/t)), the rest whole; ZeRO then
shards those over the data-parallel group. So the estimator works on the rank's own parameter shapes.

Activations, per block (b rows of s tokens, width h, a heads; sequence parallelism in brackets):

    split t ways      attention's q, k, v 3bsh/t, its output bsh/t (c_proj's input, one array) and
                      log-sum-exp b(a/t)s; the MLP's up-projection output and GELU output 4bsh/t each
    whole             the column-parallel products' inputs, bsh each (under SP the gathered sequence)
    the LN region     the block's input and the residual's (the LayerNorms' inputs) bsh each, their
                      statistics 2bs each, the residual dropout masks bsh bytes each: whole [1/t]

and around the blocks: the embedding's dropout mask, the final LayerNorm's input and statistics [1/t], the
head's input whole, the logits b·s·ceil(V/t) (the vocab-parallel loss never builds b·s·V); the token ids
and targets, as a whole model keeps them. Compare Korthikanti et al. (2022): sbh(10 + 24/t + 5as/(ht))
bytes per layer under TP, (sbh/t)(34 + 5as/h) under TP+SP, at 2 bytes per element and their ops.

Under sequence parallelism the replicated parameters of the LN region get partial gradients: once per
step they are summed over the TP group through one buffer holding all of them (a communication buffer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine.config.build import param_shapes
from engine.parallel.tensor import local_shapes, shard_specs


@dataclass(frozen=True)
class TensorSplit:
    """How a rank's activations divide: `t` the tensor-parallel degree, `region` what the LayerNorm and
    dropout region divides by (t under sequence parallelism, else 1)."""
    t: int = 1
    region: int = 1

    @classmethod
    def of(cls, cfg) -> TensorSplit:
        t = cfg.parallel.tensor
        return cls(t, t if cfg.parallel.sequence_parallel else 1)


def rank_shapes(cfg, vocab: int) -> list[tuple[str, tuple, int | None]]:
    """param_shapes(cfg, vocab) with every shape as one tensor-parallel rank holds it."""
    dense = param_shapes(cfg, vocab)
    local = local_shapes(cfg.model.kind, [(name, shape) for name, shape, _ in dense], cfg.parallel.tensor)
    return [(name, shape, unit) for (name, _, unit), (_, shape) in zip(dense, local)]


def sequence_region_numel(cfg, shapes) -> int:
    """Elements of the parameters whose gradients sequence parallelism sums over the group (the LayerNorms
    and the row-parallel layers' biases, as the plan lists them); 0 without it."""
    if not (cfg.parallel.sequence_parallel and cfg.parallel.tensor > 1):
        return 0
    partial = (".ln_1.", ".ln_2.", ".attn.c_proj.bias", ".mlp.layers.1.bias")
    return sum(math.prod(shape) for name, shape, _ in shapes
               if name.startswith("ln_f.") or any(part in f".{name}" for part in partial))


def row_parallel_modules(cfg, shapes) -> frozenset[str]:
    """The modules the plan makes row-parallel (their weight cut along its input features): their bias
    is added after the reduce, a separate op, so backward finishes it before the weight."""
    specs = shard_specs(cfg.model.kind, [(name, shape) for name, shape, _ in shapes], cfg.parallel.tensor)
    return frozenset(name.rpartition(".")[0] for name, spec in specs.items()
                     if name.endswith(".weight") and spec.axis == 1)
