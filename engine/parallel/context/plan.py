"""The plan: context parallelism applied to a finished GPT, in place, as tensor parallelism's plan is.

Every rank of a context-parallel group builds the same model (from one seed) and keeps all of it: the
ranks hold the same weights and split the tokens. Two things in a GPT depend on where a token stands in
its sequence, and only they change:

    attention        each block's attention runs as ring attention over the group (ring_attention.py):
                     its QKV and output projections are the block's own (tensor-parallel ones included:
                     the plan runs after tensor parallelism's, on the local heads)
    position embedding  the rows of this rank's global positions (layout.py), not 0..t-1

    dropout          every dropout draws this rank's part of the one-device masks (dropout.py): the
                     token-wise ones the rows of its positions, attention's each block's rectangle

Everything else (embedding, layer norms, MLPs, the head, the loss) works token by token and is untouched.
The rank's tokens and targets are taken from whole sequences by `ContextParallel.local` (view.py), which
the trainer (and a pipeline's step) calls for every batch.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from engine.comm.base import Communicator
from engine.nn import GPT, CausalSelfAttention, Embedding, Module
from engine.parallel.context.dropout import ContextMaskRNG, context_rng
from engine.parallel.context.layout import SequenceLayout
from engine.parallel.context.ring_attention import Ring, ring_attention_qkv
from engine.parallel.context.view import ContextParallel
from engine.tensor import Tensor


class RingSelfAttention(Module):
    """A block's attention with the ring in place of whole-sequence attention; the same projections (and
    parameter names) as the CausalSelfAttention it replaces."""

    def __init__(self, attn: CausalSelfAttention, ring: Ring):
        super().__init__()
        self.n_head = attn.n_head  # the local heads under tensor parallelism (its plan ran first)
        self.c_attn, self.c_proj, self.resid_drop = attn.c_attn, attn.c_proj, attn.resid_drop
        # attention's dropout draws from the whole [B, H, s, s] mask (this rank's heads under TP)
        self.dropout, self.rng = attn.dropout, attn.rng
        self.ring = ring

    def forward(self, x: Tensor) -> Tensor:
        # `count`: evaluations are not counted as work
        y = ring_attention_qkv(self.c_attn(x), self.n_head, self.ring, self.training, self.dropout, self.rng,
                               self.training)
        return self.resid_drop(self.c_proj(y))


class SlicePositions(Embedding):
    """A position embedding that gives a context-parallel rank the rows of its own tokens' positions."""

    def __init__(self, weight, layout: SequenceLayout, rank: int):
        Module.__init__(self)
        self.weight, self.layout, self.rank = weight, layout, rank

    def positions(self, t: int) -> Tensor:
        """Rows of this rank's positions in sequences of t x degree tokens (t: the tokens it holds)."""
        return self.weight[self.layout.positions(t * self.layout.degree, self.rank)]


def parallelize_context(model: Module, group: Communicator, kind: str = "zigzag") -> Module:
    """Make `model` (a GPT, tensor-parallel or not) this rank's context-parallel form over `group`, laid
    out by `kind` (layout.CONTEXT_LAYOUTS); a group of one leaves it as it is. Returns the model."""
    if group.world_size == 1:
        return model
    if not isinstance(model, GPT):
        raise TypeError(f"context parallelism splits a GPT's sequences, not a {type(model).__name__}'s")
    layout = SequenceLayout(kind, group.world_size)
    ring = Ring(group, layout, causal=True, work=Counter())
    base = model.rng
    assert base is not None  # a GPT always holds its DropoutRNG
    positions = ContextMaskRNG(base, layout, group.rank)  # token-wise masks: this rank's rows of them
    model.drop.rng = context_rng(model.drop.rng, base, positions)
    for block in model.blocks:
        block.attn = RingSelfAttention(block.attn, ring)  # type: ignore[assignment]
        for drop in (block.attn.resid_drop, block.drop):  # the MLP's own dropout is 0 in a GPT block
            drop.rng = context_rng(drop.rng, base, positions)
    model.wpe = SlicePositions(model.wpe.weight, layout, group.rank)
    planned: Any = model  # a new attribute, outside the model's own API: read it through context_of
    planned.context_parallel = ContextParallel(group, layout, ring)
    return model
