"""The plan: tensor (and sequence) parallelism applied to a finished dense model, in place.

Like torchtitan's parallelize_module, the model's code is untouched: its layers are swapped for their
parallel forms, each holding this rank's shard of the dense layer's weights. Every rank builds the same
dense model from one seed first, so a tensor-parallel run starts from, and trains, what one device does.

GPT, per block (t ranks, a heads, width h; sequence parallelism in brackets):

    ln_1 [on s/t of the sequence]
    attn.c_attn   column-parallel, q, k and v each split by heads   f [all-gather the sequence]
    attention     a/t heads on each rank (n_head set to the local count)
    attn.c_proj   row-parallel, bias after the reduce                g [reduce-scatter the sequence]
    ln_2 [on s/t]
    mlp up        column-parallel (4h/t features)                    f [all-gather]
    mlp down      row-parallel                                       g [reduce-scatter]

    per block: 2 all-reduces forward and 2 backward [2 all-gathers and 2 reduce-scatters forward, the
    mirror backward]: the same bytes

and around the blocks: the vocab-parallel embedding (rows split, g); [the embedding's dropout takes this
rank's slice of the sequence]; ln_f [on s/t]; the output layer, tied to the embedding's shard, column-
parallel over the vocabulary (f [all-gather]); the vocab-parallel cross-entropy (layout.loss). Dropout
draws each rank's part of the one-device masks (dropout.py).

An MLP model: its layers in (column, row) pairs; the loss on whole logits.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from engine.comm.base import Communicator
from engine.dropout_rng import DropoutRNG
from engine.moe import MoE
from engine.nn import GPT, MLP, Module
from engine.parallel.expert.tensor import gather_around_moe, shard_experts
from engine.parallel.tensor.dropout import SequenceShardDropout, ShardedMaskRNG
from engine.parallel.tensor.layers import (
    ColumnParallelLinear,
    column_parallel,
    row_parallel,
    sharded_parameter,
)
from engine.parallel.tensor.layout import TensorParallelLayout
from engine.parallel.tensor.mappings import Tally
from engine.parallel.tensor.slicing import ShardSpec
from engine.parallel.tensor.vocab import VocabParallelEmbedding, vocab_slice
from engine.parallel.tensor.whole import WholeModel
from engine.tensor import Parameter


def parallelize(model: Module, group: Communicator, sequence_parallel: bool = False) -> Module:
    """Make `model` (a dense GPT or MLP, as built on every rank) this rank's tensor-parallel shard over
    `group`; returns it, with `model.tensor_parallel` (a TensorParallelLayout: the loss, the gradient steps,
    the dense view)."""
    if getattr(model, "tensor_parallel", None) is not None:
        raise ValueError("this model is tensor-parallel already")
    if isinstance(model, GPT):
        layout = _parallelize_gpt(model, group, sequence_parallel)
    elif isinstance(model, MLP):
        layout = _parallelize_mlp(model, group, sequence_parallel)
    else:
        raise TypeError(f"tensor parallelism has a plan for GPT and MLP models, not {type(model).__name__}")
    dense: Any = model  # a new attribute, outside the model's own API: read it through layout_of
    dense.tensor_parallel = layout
    return model


def layout_of(model: Module) -> TensorParallelLayout | None:
    """The model's TensorParallelLayout, or None for a dense model."""
    return getattr(model, "tensor_parallel", None)


def model_layout(model: Module) -> TensorParallelLayout | WholeModel:
    """The model's TensorParallelLayout, or for a dense model the stand-in that answers the same questions
    (nothing sharded, the plain loss): what the trainer, the replicas and checkpoints ask."""
    layout = layout_of(model)
    return WholeModel() if layout is None else layout


def _sharded_rng(model: Module, group: Communicator) -> ShardedMaskRNG:
    if not isinstance(model.rng, DropoutRNG):
        raise ValueError(f"a {type(model).__name__} without its DropoutRNG cannot be made tensor-parallel")
    return ShardedMaskRNG(model.rng, group.world_size, group.rank)


def _record(specs: dict[str, ShardSpec], spec: ShardSpec, *params: Parameter) -> None:
    """How each of `params` is cut, under its dense name."""
    for p in params:
        if p.name is None:
            raise ValueError("tensor parallelism needs a model whose parameters its root module has named")
        specs[p.name] = spec


def _params(*modules) -> list[Parameter]:
    return [p for m in modules for p in (m.weight, m.bias) if p is not None]


def _parallelize_gpt(model: GPT, group: Communicator, sp: bool) -> TensorParallelLayout:
    t, rank = group.world_size, group.rank
    n_head = model.config["n_head"]
    if n_head % t:
        raise ValueError(f"tensor parallelism splits attention's {n_head} heads {t} ways: "
                         f"model.n_head must be a multiple of the tensor-parallel degree")
    rng = _sharded_rng(model, group)
    specs: dict[str, ShardSpec] = {}
    in_sequence_region: list[Parameter] = []  # replicated, but each rank sees s/t of the tokens
    tally: Tally = Counter()  # the blocks' collectives, by phase (layout.collectives_per_layer)

    def record(layer, spec: ShardSpec, with_bias: bool = True) -> None:
        _record(specs, spec, layer.weight, *([layer.bias] if with_bias and layer.bias is not None else []))

    for block in model.blocks:
        attn, mlp = block.attn, block.mlp
        if not isinstance(mlp, MoE) and mlp.drop.p:
            raise ValueError("a block's MLP dropout inside the tensor-parallel region is not planned")
        attn.c_attn, spec = column_parallel(attn.c_attn, group, sp, 3, tally)  # type: ignore[assignment]
        record(attn.c_attn, spec)
        attn.c_proj, spec = row_parallel(attn.c_proj, group, sp, tally)  # type: ignore[assignment]
        record(attn.c_proj, spec, with_bias=False)
        if isinstance(mlp, MoE):  # each expert split as this MLP would be, the router whole
            shard_experts(mlp, group, tally, record)
            if sp:  # on the whole sequence: gathered on the way in, sliced on the way out
                gather_around_moe(block, group, tally)
        else:
            mlp.layers[0], spec = column_parallel(mlp.layers[0], group, sp, 1, tally)  # type: ignore[call-overload]
            record(mlp.layers[0], spec)
            mlp.layers[-1], spec = row_parallel(mlp.layers[-1], group, sp, tally)  # type: ignore[call-overload]
            record(mlp.layers[-1], spec, with_bias=False)
        attn.n_head //= t  # the fused attention reads its heads from the QKV output: a/t of them here
        attn.rng = rng  # attention's dropout: this rank's heads of the one-device mask
        if sp:
            attn.resid_drop.rng = block.drop.rng = rng
            rows = (attn.c_proj,) if isinstance(mlp, MoE) else (attn.c_proj, mlp.layers[-1])  # experts: whole
            row_biases = [layer.bias for layer in rows if layer.bias is not None]
            in_sequence_region += _params(block.ln_1, block.ln_2) + row_biases

    vocab = ShardSpec(axis=0, length=model.vocab_size, parts=t)
    first, valid = vocab_slice(vocab, rank)
    tied = model.lm_head.weight is model.wte.weight
    embedding = sharded_parameter(model.wte.weight, vocab, rank)
    head = embedding if tied else sharded_parameter(model.lm_head.weight, vocab, rank)
    _record(specs, vocab, embedding, head)
    model.wte = VocabParallelEmbedding(embedding, group, first, valid)  # type: ignore[assignment]
    model.lm_head = ColumnParallelLinear(head, None, group, sp)  # type: ignore[assignment]
    if sp:
        model.drop = SequenceShardDropout(model.drop.p, rng, group)  # type: ignore[assignment]
        in_sequence_region += _params(model.ln_f)
    return TensorParallelLayout(group, sp, model.named_parameters(), specs, in_sequence_region, vocab,
                                tally=tally, units=len(model.blocks))


def _parallelize_mlp(model: MLP, group: Communicator, sp: bool) -> TensorParallelLayout:
    layers, t = model.layers, group.world_size
    if sp:
        raise ValueError("sequence parallelism splits a sequence: an MLP model has none")
    if len(layers) % 2:
        raise ValueError(f"tensor parallelism pairs an MLP's layers (column-, then row-parallel): "
                         f"{len(layers)} layers do not pair up")
    if model.drop.p and len(layers) > 2:
        raise ValueError("dropout in a tensor-parallel MLP is planned for one hidden layer only")
    specs: dict[str, ShardSpec] = {}
    tally: Tally = Counter()
    for i in range(0, len(layers), 2):
        if layers[i].weight.shape[0] % t:
            raise ValueError(f"hidden width {layers[i].weight.shape[0]} does not split {t} ways")
        column, spec = column_parallel(layers[i], group, tally=tally)
        _record(specs, spec, *_params(column))
        row, spec = row_parallel(layers[i + 1], group, tally=tally)
        _record(specs, spec, row.weight)
        layers[i], layers[i + 1] = column, row  # type: ignore[call-overload]
    model.drop.rng = _sharded_rng(model, group)  # the hidden layer is split by features
    return TensorParallelLayout(group, False, model.named_parameters(), specs, [], tally=tally,
                                units=len(layers) // 2)
