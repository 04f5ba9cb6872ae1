"""PyTorch twins of our GPT and MLP, built from our weights: the reference for parity tests and benchmarks.

The twins use our parameter names and our Linear layout ([out, in], PyTorch's own), so the name map is
the identity: `torch_params_by_name(ours, twin)[name]` is the torch Parameter of our Parameter `name`.
Importing this module needs PyTorch. It is a reference for tests and `bench step` only: nothing in
the engine imports it, and PyTorch is never a runtime dependency.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn as tnn

from engine import nn


def torch_dtype(dtype) -> torch.dtype:
    return {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
            "float64": torch.float64}[np.dtype(dtype).name]


def to_torch(array: np.ndarray) -> torch.Tensor:
    """A torch copy of a NumPy array of any of our dtypes (bfloat16 goes through float32, exactly)."""
    if array.dtype.kind == "f" and array.dtype.itemsize >= 4:
        return torch.from_numpy(np.array(array))
    return torch.from_numpy(array.astype(np.float32)).to(torch_dtype(array.dtype))


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """float32 or float64 NumPy copy (16-bit tensors are widened exactly)."""
    t = t.detach()
    return (t if t.dtype == torch.float64 else t.float()).numpy().copy()


class TorchMLP(tnn.Module):
    def __init__(self, widths, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        self.layers = tnn.ModuleList(tnn.Linear(i, o, bias) for i, o in zip(widths[:-1], widths[1:]))
        self.drop = tnn.Dropout(dropout)

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = self.drop(F.gelu(x, approximate="tanh"))
        return x


class TorchAttention(tnn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool, fused: bool):
        super().__init__()
        self.n_head, self.dropout, self.fused = n_head, dropout, fused
        self.c_attn = tnn.Linear(n_embd, 3 * n_embd, bias)
        self.c_proj = tnn.Linear(n_embd, n_embd, bias)
        self.resid_drop = tnn.Dropout(dropout)

    def forward(self, x):
        qkv = self.c_attn(x)  # the shapes from its output: a tensor-parallel twin's holds n_head / t heads
        b, t, c = qkv.shape[0], qkv.shape[1], qkv.shape[2] // 3
        q, k, v = (h.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for h in qkv.split(c, dim=2))
        p = self.dropout if self.training else 0.0
        if self.fused:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(k.shape[-1])
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            att = F.dropout(att.masked_fill(mask, float("-inf")).softmax(-1), p, self.training)
            y = att @ v
        return self.resid_drop(self.c_proj(y.transpose(1, 2).reshape(b, t, c)))


class TorchBlock(tnn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool, fused: bool):
        super().__init__()
        self.ln_1 = tnn.LayerNorm(n_embd, bias=bias)
        self.attn = TorchAttention(n_embd, n_head, dropout, bias, fused)
        self.ln_2 = tnn.LayerNorm(n_embd, bias=bias)
        self.mlp = TorchMLP([n_embd, 4 * n_embd, n_embd], 0.0, bias)
        self.drop = tnn.Dropout(dropout)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.drop(self.mlp(self.ln_2(x)))


class TorchGPT(tnn.Module):
    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd, dropout=0.0, tie_weights=True,
                 bias=True, fused_attention=False):
        super().__init__()
        self.wte = tnn.Embedding(vocab_size, n_embd)
        self.wpe = tnn.Embedding(block_size, n_embd)
        self.drop = tnn.Dropout(dropout)
        self.blocks = tnn.ModuleList(TorchBlock(n_embd, n_head, dropout, bias, fused_attention)
                                     for _ in range(n_layer))
        self.ln_f = tnn.LayerNorm(n_embd, bias=bias)
        self.lm_head = tnn.Linear(n_embd, vocab_size, bias=False)
        if tie_weights:
            self.lm_head.weight = self.wte.weight

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def torch_model_from(model: nn.Module, fused_attention: bool = False) -> tnn.Module:
    """A torch GPT or MLP with our model's architecture, dtype and exact weights (float16/bfloat16
    weights are copied exactly). forward(idx int64 [B, T] or x [B, in]) returns logits."""
    twin: tnn.Module
    if isinstance(model, nn.GPT):
        twin = TorchGPT(**model.config, fused_attention=fused_attention)
    elif isinstance(model, nn.MLP):
        twin = TorchMLP(**model.config)
    else:
        raise TypeError(f"no torch twin for {type(model).__name__}")
    dtype = model.parameters()[0].dtype
    twin = twin.to(torch_dtype(dtype))
    twin.train(model.training)
    params = torch_params_by_name(model, twin)
    with torch.no_grad():
        for name, p in model.named_parameters():
            params[name].copy_(to_torch(p.data))
    return twin


def torch_params_by_name(model: nn.Module, twin: tnn.Module) -> dict[str, tnn.Parameter]:
    """Our parameter name -> the twin's Parameter (names are identical; a tied weight appears once)."""
    theirs = dict(twin.named_parameters())
    ours = [name for name, _ in model.named_parameters()]
    if sorted(ours) != sorted(theirs):
        raise AssertionError(f"parameter names differ: ours {ours} vs torch {list(theirs)}")
    return {name: theirs[name] for name in ours}


def torch_adamw(twin: tnn.Module, optim_cfg) -> torch.optim.AdamW:
    """torch's AdamW configured like ours: weight decay on matrices only (ndim >= 2)."""
    o = optim_cfg
    groups = [{"params": [p for p in twin.parameters() if p.ndim >= 2], "weight_decay": o.weight_decay},
              {"params": [p for p in twin.parameters() if p.ndim < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps)


def torch_train_step(twin: tnn.Module, opt: torch.optim.Optimizer, x: np.ndarray, y: np.ndarray,
                     grad_clip: float, autocast: torch.dtype | None = None) -> float:
    """One step as our trainer takes it: mean cross-entropy, backward, global-norm clip, AdamW. `autocast`
    (torch.bfloat16 or torch.float16): the forward under torch.autocast on the CPU, PyTorch's own mixed
    precision (float32 weights and optimizer, the products in 16-bit)."""
    with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
        logits = twin(torch.from_numpy(x))
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.from_numpy(y).reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip:
        torch.nn.utils.clip_grad_norm_(twin.parameters(), grad_clip)
    opt.step()
    return loss.item()
