"""Modules: Linear, Embedding, LayerNorm, Dropout, MLP, Block and GPT.

Linear weights use PyTorch's layout, [out_features, in_features], so a tied GPT head is simply
`linear(x, wte.weight)` and a PyTorch state dict maps name for name. Parameter names are dotted
attribute paths ("blocks.0.attn.c_attn.weight"), in definition order; a tied weight appears once,
under its first name. Models never know they are distributed.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from engine import ops
from engine.dropout_rng import DropoutRNG
from engine.tensor import Parameter, Tensor, no_grad

# model.kind -> the data it trains on (engine.data.DATA_KINDS) and what it is
MODEL_KINDS = {"gpt": ("lm", "character-level transformer"), "mlp": ("classification", "classifier")}


class Module:
    """A tree of modules and Parameters found through attributes (and lists of modules).

    What wrappers (data parallelism, activation checkpointing) may rely on, besides parameters():
    `units()`, the model's repeated layers in forward order, each called once per forward through
    `__call__` (so forward hooks see it) — ZeRO-3 gathers them one at a time; `checkpoint_units()`, the
    units whose forward takes and returns one Tensor and draws randomness only from `rng` — activation
    checkpointing recomputes those; and `rng`, the one DropoutRNG all of the model's dropout draws from
    (None for a module that draws nothing of its own): its masks are keyed by the step and the global
    row, which whoever runs the model sets with `rng.begin(step, first_row)` before a forward.
    """

    rng: DropoutRNG | None = None

    def __init__(self):
        self.training = True
        self.forward_pre_hooks: list = []   # fn(module), before forward
        self.forward_post_hooks: list = []  # fn(module, out) -> replacement out or None

    def __call__(self, *args, **kwargs):
        for hook in self.forward_pre_hooks:
            hook(self)
        out = self.forward(*args, **kwargs)
        for hook in self.forward_post_hooks:
            replaced = hook(self, out)
            if replaced is not None:
                out = replaced
        return out

    def forward(self, *args, **kwargs):
        raise NotImplementedError

    def units(self) -> list[Module]:
        """The repeated layers, in forward order; [] for a module without any."""
        return []

    def checkpoint_units(self) -> list[Module]:
        """The units activation checkpointing may recompute; [] when it cannot."""
        return []

    def named_children(self) -> list[tuple[str, Module]]:
        children = []
        for name, value in vars(self).items():
            if isinstance(value, Module):
                children.append((name, value))
            elif isinstance(value, (list, tuple)):
                children.extend((f"{name}.{i}", m) for i, m in enumerate(value) if isinstance(m, Module))
        return children

    def children(self) -> list[Module]:
        return [m for _, m in self.named_children()]

    def modules(self) -> list[Module]:
        """This module and every descendant, depth first in definition order."""
        return [self] + [m for child in self.children() for m in child.modules()]

    def _owned_parameters(self, prefix: str = ""):
        """(dotted name, owning module, attribute, Parameter) for every parameter, shared ones included."""
        for attr, value in vars(self).items():
            if isinstance(value, Parameter):
                yield prefix + attr, self, attr, value
        for name, child in self.named_children():
            yield from child._owned_parameters(f"{prefix}{name}.")

    def named_parameters(self) -> list[tuple[str, Parameter]]:
        """Every Parameter once (a tied weight under its first name), in definition order."""
        seen, named = set(), []
        for name, _, _, p in self._owned_parameters():
            if id(p) not in seen:
                seen.add(id(p))
                named.append((name, p))
        return named

    def parameters(self) -> list[Parameter]:
        return [p for _, p in self.named_parameters()]

    def train(self, mode: bool = True) -> Module:
        for m in self.modules():
            m.training = mode
        return self

    def eval(self) -> Module:
        return self.train(False)

    def _name_parameters(self) -> None:
        """Give each Parameter its dotted name relative to this (root) module."""
        for name, p in self.named_parameters():
            p.name = name


class Linear(Module):
    """y = x @ weight.T + bias with weight [out_features, in_features] (PyTorch's layout)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, dtype=np.float32):
        super().__init__()
        self.weight = Parameter(np.zeros((out_features, in_features), dtype=dtype))
        self.bias = Parameter(np.zeros(out_features, dtype=dtype)) if bias else None
        self.residual = False  # a projection into the residual stream: init std / sqrt(2 n_layer)

    def forward(self, x: Tensor) -> Tensor:
        return ops.linear(x, self.weight, self.bias)


class Embedding(Module):
    def __init__(self, num_embeddings: int, embedding_dim: int, dtype=np.float32):
        super().__init__()
        self.weight = Parameter(np.zeros((num_embeddings, embedding_dim), dtype=dtype))

    def forward(self, idx) -> Tensor:
        return ops.embedding(idx, self.weight)

    def positions(self, t: int) -> Tensor:
        """As a GPT's position embedding: the rows of a sequence of t tokens, positions 0..t-1 (a
        context-parallel rank, which holds a slice of every sequence, swaps in rows of its slice's
        positions)."""
        return self.weight[:t]


class LayerNorm(Module):
    def __init__(self, dim: int, bias: bool = True, dtype=np.float32, eps: float = 1e-5):
        super().__init__()
        self.weight = Parameter(np.ones(dim, dtype=dtype))
        self.bias = Parameter(np.zeros(dim, dtype=dtype)) if bias else None
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return ops.layer_norm(x, self.weight, self.bias, self.eps)


class Dropout(Module):
    """Draws its masks from `rng`, the DropoutRNG its model holds (shared: one site counter per forward)."""

    def __init__(self, p: float, rng: DropoutRNG):
        super().__init__()
        self.p = p
        self.rng: DropoutRNG = rng

    def forward(self, x: Tensor) -> Tensor:
        return ops.dropout(x, self.p, self.rng, self.training)


class MLP(Module):
    """Linear layers of the given widths with GELU (then dropout) between them; forward(x[..., in])."""

    def __init__(self, widths, dropout: float = 0.0, bias: bool = True, dtype=np.float32,
                 rng: DropoutRNG | None = None):
        super().__init__()
        if len(widths) < 2:
            raise ValueError(f"an MLP needs at least an input and an output width, got {list(widths)}")
        self.config: dict[str, Any] = dict(widths=list(widths), dropout=dropout, bias=bias)
        self.dtype = np.dtype(dtype)
        self.rng = rng if rng is not None else DropoutRNG(0)
        self.layers = [Linear(i, o, bias, dtype) for i, o in zip(widths[:-1], widths[1:])]
        self.drop = Dropout(dropout, self.rng)
        if rng is None:  # standalone; inside a GPT block the GPT names and initialises everything
            self._name_parameters()
            init_params(self, 0)

    def units(self) -> list[Module]:
        return list(self.layers)

    def forward(self, x) -> Tensor:
        x = x if isinstance(x, Tensor) else Tensor(np.asarray(x, dtype=self.dtype))
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = self.drop(ops.gelu(x))
        return x


class CausalSelfAttention(Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool, dtype, rng):
        super().__init__()
        if n_embd % n_head:
            raise ValueError(f"n_embd ({n_embd}) must be a multiple of n_head ({n_head})")
        self.n_head, self.dropout, self.rng = n_head, dropout, rng
        self.c_attn = Linear(n_embd, 3 * n_embd, bias, dtype)
        self.c_proj = Linear(n_embd, n_embd, bias, dtype)
        self.c_proj.residual = True
        self.resid_drop = Dropout(dropout, rng)

    def forward(self, x: Tensor) -> Tensor:
        y = ops.causal_attention_qkv(self.c_attn(x), self.n_head, self.dropout, self.rng, self.training)
        return self.resid_drop(self.c_proj(y))


class Block(Module):
    """Pre-LN transformer block: x + attn(ln_1(x)), then x + mlp(ln_2(x)) with a 4x wide MLP."""

    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool, dtype, rng):
        super().__init__()
        self.ln_1 = LayerNorm(n_embd, bias, dtype)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout, bias, dtype, rng)
        self.ln_2 = LayerNorm(n_embd, bias, dtype)
        self.mlp = MLP([n_embd, 4 * n_embd, n_embd], 0.0, bias, dtype, rng)
        self.mlp.layers[-1].residual = True
        self.drop = Dropout(dropout, rng)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.drop(self.mlp(self.ln_2(x)))


class GPT(Module):
    """GPT-2 style decoder: forward(idx[B, T] int) -> logits[B, T, vocab]. `.rng` keys all dropout."""

    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int,
                 dropout: float = 0.0, tie_weights: bool = True, bias: bool = True, dtype=np.float32):
        super().__init__()
        self.config: dict[str, Any] = dict(vocab_size=vocab_size, block_size=block_size, n_layer=n_layer,
                                           n_head=n_head, n_embd=n_embd, dropout=dropout,
                                           tie_weights=tie_weights, bias=bias)
        self.vocab_size, self.block_size, self.n_layer = vocab_size, block_size, n_layer
        self.rng = DropoutRNG(0)
        self.wte = Embedding(vocab_size, n_embd, dtype)
        self.wpe = Embedding(block_size, n_embd, dtype)
        self.drop = Dropout(dropout, self.rng)
        self.blocks = [Block(n_embd, n_head, dropout, bias, dtype, self.rng) for _ in range(n_layer)]
        self.ln_f = LayerNorm(n_embd, bias, dtype)
        self.lm_head = Linear(n_embd, vocab_size, bias=False, dtype=dtype)
        if tie_weights:
            self.lm_head.weight = self.wte.weight
        self._name_parameters()
        init_params(self, 0)

    def units(self) -> list[Module]:
        return list(self.blocks)

    def checkpoint_units(self) -> list[Module]:
        return list(self.blocks)

    def forward(self, idx) -> Tensor:
        x = embed(self.wte, self.wpe, self.drop, self.block_size, idx)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))

    def generate(self, idx, n: int, temperature: float = 1.0,
                 rng: np.random.Generator | None = None, top_k: int = 0) -> np.ndarray:
        """Append n sampled tokens to idx[B, T] (temperature 0: greedy), in eval mode, without a tape.
        top_k > 0 samples among the k most likely tokens only (all tokens tied with the k-th stay in)."""
        rng = rng if rng is not None else np.random.default_rng()
        idx, was_training = np.asarray(idx), self.training
        self.eval()
        try:
            with no_grad():
                for _ in range(n):
                    logits = self(idx[:, -self.block_size:]).data[:, -1, :].astype(np.float64)
                    if temperature == 0:
                        nxt = logits.argmax(-1)
                    else:
                        if 0 < top_k < logits.shape[-1]:
                            kth = np.partition(logits, -top_k, axis=-1)[:, -top_k, None]
                            logits = np.where(logits < kth, -np.inf, logits)
                        p = np.exp((logits - logits.max(-1, keepdims=True)) / temperature)
                        cdf = np.cumsum(p / p.sum(-1, keepdims=True), axis=-1)
                        nxt = np.minimum((cdf < rng.random((len(idx), 1))).sum(-1), self.vocab_size - 1)
                    idx = np.concatenate([idx, nxt[:, None].astype(idx.dtype)], axis=1)
        finally:
            self.train(was_training)
        return idx


def embed(wte: Module, wpe: Embedding, drop: Module, block_size: int, idx) -> Tensor:
    """A GPT's input: token plus position embeddings of idx[B, T], dropped out (GPT.forward, and the first
    stage of a pipeline, which holds these layers without the rest)."""
    idx = idx.data if isinstance(idx, Tensor) else np.asarray(idx)
    t = idx.shape[1]
    if t > block_size:
        raise ValueError(f"sequence of {t} tokens is longer than block_size {block_size}")
    return drop(wte(idx) + wpe.positions(t))


def init_params(model: Module, seed: int) -> None:
    """GPT-2 initialisation, deterministic in `seed`, written in place (flat-buffer views survive).

    Weights ~ N(0, 0.02), residual projections N(0, 0.02 / sqrt(2 n_layer)); LayerNorm ones/zeros;
    biases zero. Draws are float64 in parameter order, then rounded to each parameter's dtype, so
    models of different precisions start from the same weights. Also keys the model's dropout on `seed`.
    """
    rng = np.random.default_rng(seed)
    residual_std = 0.02 / math.sqrt(2 * getattr(model, "n_layer", 1))
    seen = set()
    for _, module, attr, p in model._owned_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        if isinstance(module, LayerNorm):
            p.data[...] = 1.0 if attr == "weight" else 0.0
        elif attr == "bias":
            p.data[...] = 0.0
        else:
            std = residual_std if getattr(module, "residual", False) else 0.02
            p.data[...] = (rng.standard_normal(p.shape) * std).astype(p.dtype)
    model_rng = getattr(model, "rng", None)
    if isinstance(model_rng, DropoutRNG):
        model_rng.seed = seed
