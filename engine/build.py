"""Turn a validated config into the objects a rank trains: dataset and model.

Kept apart from the training loop so the estimator, the benchmarks and `sample`/`export` build the
same model the trainer does.
"""

from __future__ import annotations

from engine import nn
from engine.config import check_against_data
from engine.data import make_dataset
from engine.flat import resolve_dtype


def build_dataset(cfg):
    """The dataset of `cfg` (deterministic from cfg.seed), checked against the config where only the
    loaded data can tell (a model vocabulary smaller than the corpus's): ConfigError, one line."""
    dataset = make_dataset(cfg.data, cfg.model, cfg.seed, cfg.train.global_batch)
    if dataset.kind == "lm":
        check_against_data(cfg, len(dataset.splits["train"]), len(dataset.splits["val"]), dataset.vocab_size)
    return dataset


def vocab_size_of(cfg, dataset) -> int:
    """The GPT's vocabulary: the config's number, or the corpus's characters when it says 0."""
    return cfg.model.vocab_size or dataset.vocab_size


def build_model(cfg, dataset=None, vocab_size: int | None = None) -> nn.Module:
    """The model of `cfg`, initialised deterministically from cfg.seed, in the configured precision."""
    m, dtype = cfg.model, resolve_dtype(cfg.precision.dtype)
    if m.kind == "mlp":
        model = nn.MLP(list(m.widths), dropout=m.dropout, bias=m.bias, dtype=dtype)
    else:
        vocab = vocab_size or vocab_size_of(cfg, dataset)
        model = nn.GPT(vocab_size=vocab, block_size=m.block_size, n_layer=m.n_layer, n_head=m.n_head,
                       n_embd=m.n_embd, dropout=m.dropout, tie_weights=m.tie_weights, bias=m.bias,
                       dtype=dtype)
    nn.init_params(model, cfg.seed)
    return model


def count_params(model) -> int:
    return sum(p.data.size for p in model.parameters())
