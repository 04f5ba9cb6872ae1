"""Attention over this rank's heads: the forward a tensor-parallel CausalSelfAttention runs.

Its c_attn is column-parallel (the q, k and v of n_head / t whole heads: [b, s, 3·h/t]) and its c_proj
row-parallel (input [b, s, h/t]); `n_head` is set to the local count. Heads never mix inside attention,
so a rank computes its heads' outputs exactly as one device does, without any communication.

The dense forward reads the batch, the sequence and the width from its input x; here they differ from the
QKV output's (under sequence parallelism x holds s/t of the sequence; its width is h, not h/t), so they
are read from the QKV output instead. Installed as the module's instance `forward` (as activation
checkpointing installs its own on blocks): the module and its parameters stay where they were.
"""

from __future__ import annotations

from engine import ops
from engine.nn import CausalSelfAttention
from engine.tensor import Tensor


class LocalHeadsForward:
    """forward(x) of `attn` with whatever heads and sequence its QKV projection returns."""

    def __init__(self, attn: CausalSelfAttention):
        self.attn = attn

    def __call__(self, x: Tensor) -> Tensor:
        attn = self.attn
        qkv = attn.c_attn(x)  # [b, s, 3 · width]: this rank's heads' q, then k, then v
        b, s, width = qkv.shape[0], qkv.shape[1], qkv.shape[2] // 3
        q, k, v = [h.reshape(b, s, attn.n_head, width // attn.n_head).transpose(0, 2, 1, 3)
                   for h in ops.split(qkv, 3, axis=-1)]
        y = ops.causal_attention(q, k, v, attn.dropout, attn.rng, attn.training)
        return attn.resid_drop(attn.c_proj(y.transpose(0, 2, 1, 3).reshape(b, s, width)))
