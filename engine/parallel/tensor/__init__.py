"""Tensor parallelism, and sequence parallelism on top of it: a plan that swaps a finished dense model's
layers for their sharded forms, on the tensor-parallel group passed in (never a global one).

    file            what
    by_hand_tp.py   the readable start: one transformer block in plain NumPy, column and row products
                    with their all-reduces written out, forward and backward
    mappings.py     the conjugate ops f and g, and the sequence-parallel gather / reduce-scatter / scatter
    layers.py       column- and row-parallel Linear
    vocab.py        vocab-parallel embedding and cross-entropy (three all-reduces of b·s values)
    dropout.py      each rank's part of the one-device dropout masks
    slicing.py      how a dense weight is cut t ways (q, k, v by heads; a vocabulary padded) and joined
    plan.py         parallelize(model, group, sequence_parallel): the transform, GPT and MLP
    specs.py        the plan's cut from parameter names and shapes alone (estimator, checkpoints)
    layout.py       what the plan made: the loss, the sequence-parallel gradient sum, the gradient norm
                    over the group, the dense view of the sharded parameters
    whole.py        the same questions answered for a model that is not tensor-parallel (model_layout)
    generate.py     sampling from the whole logits

A step on a tensor-parallel model, each rank of the group on the same batch:

    model = parallelize(build_dense_model(), tp_group, sequence_parallel)
    tp = model.tensor_parallel
    loss = tp.loss(model(x), y); loss.backward()        # collectives run inside forward and backward
    tp.reduce_sequence_parallel_grads()                 # once per step; nothing without SP
    clip = global_norm_clip_scale(tp.grad_sum_of_squares(), max_norm)
    ... AdamW on this rank's parameters (shards and replicas), gradients × clip
"""

from __future__ import annotations

from engine.parallel.tensor.layers import ColumnParallelLinear, RowParallelLinear
from engine.parallel.tensor.layout import TensorParallelLayout
from engine.parallel.tensor.plan import layout_of, model_layout, parallelize
from engine.parallel.tensor.slicing import ShardSpec
from engine.parallel.tensor.specs import local_shapes, shard_specs
from engine.parallel.tensor.vocab import VocabParallelEmbedding, vocab_parallel_cross_entropy

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "ShardSpec", "TensorParallelLayout",
           "VocabParallelEmbedding", "layout_of", "local_shapes", "model_layout", "parallelize",
           "shard_specs", "vocab_parallel_cross_entropy"]
