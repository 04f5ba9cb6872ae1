"""The vocabulary split t ways: the embedding, the output layer's logits and the loss over them.

Rank r holds the contiguous rows [first, first + valid) of the embedding (ShardSpec on axis 0; a
vocabulary that t does not divide is padded with zero rows at the end, so the last rank(s) hold fewer real
rows: `valid` of them). A tied output layer reuses that shard, so each rank computes the logits of its
own vocabulary slice: [b, s, V/t], never [b, s, V].

    embedding      rows outside the rank's slice give zeros; the all-reduce (g) sums the one real row
                   with zeros, so the result equals the dense lookup bit for bit
    cross-entropy  log-sum-exp and the target's logit need the whole row: three all-reduces of b·s values
                   (Megatron-LM's cross_entropy.py), not a gather of the b·s·V logits —
                     1. max     the row's largest logit (for a stable exp)
                     2. sum     the logit of the target, from the one rank whose slice holds it
                     3. sum     sum of exp(logit - max) over every rank's columns
                   padded columns are -inf (they would otherwise count exp(0 - max) each); the backward
                   needs no communication: softmax minus the one-hot, on the rank's own columns
"""

from __future__ import annotations

import numpy as np

from engine.comm.base import Communicator
from engine.dtypes import compute_dtype
from engine.fast import lowp
from engine.nn import Module
from engine.parallel.tensor.mappings import all_reduced, collective, reduce_from_tensor_parallel
from engine.parallel.tensor.slicing import ShardSpec
from engine.tensor import Parameter, ScatterGrad, Tensor, make

LOSS_PHASE = "tp-loss-all-reduce"


def vocab_slice(spec: ShardSpec, rank: int) -> tuple[int, int]:
    """(first, valid): the first token id of rank's slice and how many real (unpadded) rows it holds."""
    lo, hi = spec.bounds(rank)
    return lo, hi - lo


def _mine(tokens: np.ndarray, first: int, valid: int) -> tuple[np.ndarray, np.ndarray]:
    """(token - first, whether it is one of this rank's tokens) of every token."""
    local = tokens - first
    return local, (local >= 0) & (local < valid)


def masked_embedding(idx: np.ndarray, weight: Tensor, first: int, valid: int) -> Tensor:
    """Rows of this rank's slice weight[valid rows, C] for the tokens in [first, first + valid); zeros for
    the others. The backward scatter-adds into the rows of the tokens it looked up, only. It keeps the
    token ids alone, as the dense embedding does (which of them are this rank's is worked out again)."""
    local, inside = _mine(idx, first, valid)
    out = weight.data[np.where(inside, local, 0)]
    out[~inside] = 0
    shape, dtype = weight.shape, weight.dtype

    def backward(g):
        local, inside = _mine(idx, first, valid)
        rows = local[inside]
        return (ScatterGrad(rows, g[inside], shape, dtype) if rows.size else None,)
    return make(out, (weight,), backward, (idx,))


class VocabParallelEmbedding(Module):
    """An Embedding whose rows are split t ways: forward(idx[B, T]) -> [B, T, C], whole on every rank."""

    def __init__(self, weight: Parameter, group: Communicator, first: int, valid: int):
        super().__init__()
        self.weight, self.group, self.first, self.valid = weight, group, first, valid

    def forward(self, idx) -> Tensor:
        idx = idx.data if isinstance(idx, Tensor) else np.asarray(idx)
        rows = masked_embedding(idx, self.weight, self.first, self.valid)
        return reduce_from_tensor_parallel(rows, self.group)


def vocab_parallel_cross_entropy(logits: Tensor, targets, group: Communicator, first: int,
                                 valid: int) -> Tensor:
    """Mean of -log softmax(logits)[target] over all targets, from this rank's columns logits[..., V/t] of
    the vocabulary [first, first + valid) (columns past `valid` are padding). Equal on every rank; a scalar
    in the compute dtype, as ops.cross_entropy. Keeps what it does: the logits, each row's log-sum-exp (b·s
    values) and the targets."""
    targets = targets.data if isinstance(targets, Tensor) else np.asarray(targets)
    dtype, cdt = logits.dtype, compute_dtype(logits.dtype)
    x, cols = logits.data.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    rows = np.arange(len(x))
    local, mine = _mine(cols, first, valid)  # mine: the rows whose target is one of this rank's tokens

    z = lowp.widen(x).astype(cdt, copy=True)
    z[:, valid:] = -np.inf
    top = z.max(-1) if valid else np.full(len(z), -np.inf, cdt)
    top = all_reduced(group, top, LOSS_PHASE, op="max")
    target_logit = np.where(mine, z[rows, np.where(mine, local, 0)], 0).astype(cdt)
    target_logit = all_reduced(group, target_logit, LOSS_PHASE)
    np.exp(z - top[:, None], out=z)
    total = all_reduced(group, z.sum(-1), LOSS_PHASE)
    lse = np.log(total) + top
    loss = np.asarray(lse.mean() - target_logit.mean(), dtype=cdt)

    def backward(g):
        p = lowp.widen(x).astype(cdt, copy=True)  # the softmax again, from the kept logits
        p -= lse[:, None]
        np.exp(p, out=p)
        p[:, valid:] = 0
        local, mine = _mine(cols, first, valid)
        p[np.flatnonzero(mine), local[mine]] -= 1
        p *= g / len(x)
        return (lowp.narrow(p, dtype).reshape(logits.shape),)
    return make(loss, (logits,), backward, (x, lse, cols))


def gather_vocab(group: Communicator, logits: np.ndarray, spec: ShardSpec) -> np.ndarray:
    """The whole logits [..., V] from every rank's [..., V/t]: b·s·V on every rank, so for sampling and
    tests, never for the loss."""
    t = group.world_size
    buf = np.empty((t,) + logits.shape, logits.dtype)
    buf[group.rank] = logits
    collective(group, "all-gather", buf.reshape(-1), "tp-gather-logits")
    return np.moveaxis(spec.unshard([np.moveaxis(part, -1, 0) for part in buf]), 0, -1)
