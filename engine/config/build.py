"""Turn a validated config into the objects a rank trains: dataset, model and its place on the device mesh;
and what the model is without building it (its parameter shapes, its vocabulary).

Kept apart from the training loop so the estimator, the benchmarks and `sample`/`export` build the
same model the trainer does.
"""

from __future__ import annotations

import math

from engine import nn
from engine.config import check_against_data
from engine.data import SYNTHETIC_LM_VOCAB, make_dataset
from engine.dtypes import resolve_dtype
from engine.moe import build_gpt, is_moe_block, moe_settings
from engine.parallel.mesh import Mesh, MeshGroups, build_groups
from engine.parallel.tensor import parallelize


def build_dataset(cfg):
    """The dataset of `cfg` (deterministic from cfg.seed), checked against the config where only the
    loaded data can tell (a model vocabulary smaller than the corpus's): ConfigError, one line. What a
    launcher builds before any rank starts (engine.run.job), so a data mistake is one line, not N failed
    ranks."""
    dataset = load_dataset(cfg)
    if dataset.kind == "lm":
        check_against_data(cfg, len(dataset.splits["train"]), len(dataset.splits["val"]), dataset.vocab_size)
    return dataset


def load_dataset(cfg):
    """The dataset of `cfg`, not checked against the config: what a rank trains on, once the launcher has
    checked the same data (build_dataset) before starting it."""
    return make_dataset(cfg.data, cfg.model, cfg.seed, cfg.train.global_batch)


def vocab_size(cfg, dataset=None) -> int:
    """The GPT's vocabulary: the config's number, else the data's (the synthetic default, or the
    corpus's characters: read from `dataset`, or loaded when none is given)."""
    if cfg.model.vocab_size:
        return cfg.model.vocab_size
    if dataset is not None:
        return dataset.vocab_size
    if cfg.data.kind == "synthetic-lm":
        return SYNTHETIC_LM_VOCAB
    return build_dataset(cfg).vocab_size


def vocab_chars(dataset) -> list[str] | None:
    """The corpus characters in token-id order (char corpora), so samples can be decoded; else None."""
    vocab = getattr(dataset, "vocab", None)
    return list(vocab.chars) if vocab is not None else None


def build_model(cfg, dataset=None, vocab: int | None = None) -> nn.Module:
    """The model of `cfg`, initialised deterministically from cfg.seed, in the configured precision."""
    m, dtype = cfg.model, resolve_dtype(cfg.precision.dtype)
    model: nn.Module
    if m.kind == "mlp":
        model = nn.MLP(list(m.widths), dropout=m.dropout, bias=m.bias, dtype=dtype)
    else:
        moe = {"moe": settings} if (settings := moe_settings(m)) else {}
        model = build_gpt(vocab_size=vocab or vocab_size(cfg, dataset), block_size=m.block_size,
                          n_layer=m.n_layer, n_head=m.n_head, n_embd=m.n_embd, dropout=m.dropout,
                          tie_weights=m.tie_weights, bias=m.bias, dtype=dtype, **moe)
    nn.init_params(model, cfg.seed)
    return model


def mesh_groups(cfg, comm) -> MeshGroups:
    """This rank's groups on the config's mesh, over `comm` (its world: the mesh's, whatever the config's
    world_size says, so a one-rank tool trains a config's model on one rank)."""
    p = cfg.parallel
    return build_groups(Mesh(comm.world_size, p.tensor, p.pipeline, p.context, p.expert, p.order), comm)


def data_parallel_comm(groups: MeshGroups, comm):
    """The communicator gradients are averaged over: the data-parallel group, or `comm` itself when that
    group is the whole world (its traffic then stays booked under "world", as it always was)."""
    return comm if groups.dp.world_size == comm.world_size else groups.dp


def shard_model(model: nn.Module, cfg, groups: MeshGroups) -> nn.Module:
    """The model as this rank trains it: tensor-parallel over its TP group (engine.parallel.tensor: the plan
    swaps the dense layers for this rank's shards) when parallel.tensor > 1, else as built."""
    if groups.tp.world_size == 1:
        return model
    return parallelize(model, groups.tp, cfg.parallel.sequence_parallel)


def count_params(model) -> int:
    """Parameters of a built model, or of a `param_shapes` list."""
    if isinstance(model, list):
        return sum(math.prod(shape) for _, shape, _ in model)
    return sum(p.data.size for p in model.parameters())


def param_shapes(cfg, vocab: int) -> list[tuple[str, tuple, int | None]]:
    """(name, shape, unit) of every parameter in the model's definition order; unit = the block (GPT)
    or layer (MLP) index it belongs to, None for parameters outside them (engine.nn's layout)."""
    m, bias = cfg.model, cfg.model.bias

    def linear(name, n_in, n_out, unit, with_bias=bias):
        weight = [(f"{name}.weight", (n_out, n_in), unit)]
        return weight + ([(f"{name}.bias", (n_out,), unit)] if with_bias else [])

    def norm(name, dim, unit):
        return [(f"{name}.weight", (dim,), unit)] + ([(f"{name}.bias", (dim,), unit)] if bias else [])

    if m.kind == "mlp":
        pairs = enumerate(zip(m.widths[:-1], m.widths[1:]))
        return [p for i, (a, b) in pairs for p in linear(f"layers.{i}", a, b, i)]
    c = m.n_embd

    def mlp_shapes(pre, i):  # a dense MLP, or the router and the experts' MLPs (engine.moe)
        dense = linear(pre + "layers.0", c, 4 * c, i) + linear(pre + "layers.1", 4 * c, c, i)
        if not is_moe_block(m, i):
            return dense
        n_experts = moe_settings(m)["n_experts"]  # type: ignore[index]  # an MoE block has them
        experts = [(name.replace(pre, f"{pre}experts.mlps.{e}.", 1), shape, unit)
                   for e in range(n_experts) for name, shape, unit in dense]
        return linear(pre + "router.gate", c, n_experts, i, with_bias=False) + experts

    shapes: list[tuple[str, tuple, int | None]] = [("wte.weight", (vocab, c), None),
                                                   ("wpe.weight", (m.block_size, c), None)]
    for i in range(m.n_layer):
        pre = f"blocks.{i}."
        shapes += (norm(pre + "ln_1", c, i) + linear(pre + "attn.c_attn", c, 3 * c, i)
                   + linear(pre + "attn.c_proj", c, c, i) + norm(pre + "ln_2", c, i)
                   + mlp_shapes(pre + "mlp.", i))
    shapes += norm("ln_f", c, None)
    if not m.tie_weights:
        shapes += linear("lm_head", c, vocab, None, with_bias=False)
    return shapes
