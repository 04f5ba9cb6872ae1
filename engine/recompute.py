"""Activation checkpointing: keep a block's input in forward, recompute the block in backward.

A checkpointed block runs its forward without the tape, so none of its intermediate arrays stay
alive; one tape node stands for the whole block and keeps only the block's input. When backward
reaches that node it re-runs the block forward *with* the tape from the saved input — through the
module's `__call__`, so forward pre/post hooks run again (ZeRO-3 re-gathers the block's parameters
there) — and backpropagates the incoming gradient through the fresh graph. The parameters
accumulate their gradients and fire their grad-ready hooks inside that inner backward, exactly
once, as DDP and ZeRO buckets expect; the node returns the input's gradient.

Dropout: the model's DropoutRNG (`model.rng`) keys every mask by (seed, step, site, global row); the
recompute rewinds it to its position (the site counter) from just before the block's forward, so the
recomputed masks are the same, then puts it back where the rest of the step left it. Recomputation
repeats the same arithmetic on the same arrays, so gradients are bitwise identical to training without
checkpointing — for about one extra forward per checkpointed block.

`memory.checkpointing`: "none" | "blocks" (every block) | "every:K" (blocks 0, K, 2K, ...).
"""

from __future__ import annotations

import threading

import numpy as np

from engine.dropout_rng import DropoutRNG
from engine.tensor import Tensor, is_grad_enabled, make, no_grad

CHECKPOINTING = ("none", "blocks", "every:K")  # the forms of memory.checkpointing


class _Recomputing(threading.local):
    depth = 0


_recomputing = _Recomputing()


def recomputing() -> bool:
    """True while a checkpointed block is being re-run in backward on this thread (hooks that
    prefetch in forward order can tell the recompute apart from the real forward)."""
    return _recomputing.depth > 0


def checkpointed_blocks(spec: str, n_blocks: int) -> list[int]:
    """Indices of the blocks a `memory.checkpointing` value recomputes."""
    if spec == "none":
        return []
    if spec == "blocks":
        return list(range(n_blocks))
    if spec.startswith("every:") and spec[6:].isdigit() and int(spec[6:]) >= 1:
        return list(range(0, n_blocks, int(spec[6:])))
    raise ValueError(f"memory.checkpointing {spec!r} is not one of {', '.join(CHECKPOINTING)} (K >= 1)")


def apply_checkpointing(model, spec: str) -> list[int]:
    """Checkpoint the model's `checkpoint_units()` named by `spec` (in place); returns their indices.

    A model without any (the MLP) accepts only "none".
    """
    blocks = model.checkpoint_units()
    if not blocks:
        if spec != "none":
            raise ValueError(f"memory.checkpointing {spec!r} needs a model with transformer blocks")
        return []
    chosen = checkpointed_blocks(spec, len(blocks))
    for i, block in enumerate(blocks):
        block.__dict__.pop("forward", None)  # undo an earlier apply
        if i in chosen:
            block.forward = CheckpointedForward(block, model.rng)
    return chosen


class CheckpointedForward:
    """Replaces one block's `forward` (an instance attribute, so `Module.__call__` finds it)."""

    def __init__(self, block, rng: DropoutRNG):
        self.block, self.rng = block, rng
        self.inner = type(block).forward.__get__(block)  # the block's own forward

    def __call__(self, x: Tensor) -> Tensor:
        if recomputing() or not is_grad_enabled():
            return self.inner(x)  # the recompute itself, or evaluation without a tape
        position = self.rng.position()
        with no_grad():
            y = self.inner(x)
        x_data, needs_x = x.data, x.requires_grad
        edge = x if needs_x else Tensor(x_data, requires_grad=True)  # the node must exist for the params

        def backward(g):
            return (self._recompute_backward(x_data, g, position),)
        return make(y.data, (edge,), backward, (x_data,))

    def _recompute_backward(self, x_data: np.ndarray, g: np.ndarray,
                            position: tuple[int, int, int]) -> np.ndarray | None:
        leaf = Tensor(x_data, requires_grad=True)
        resume_at = self.rng.position()
        self.rng.rewind(position)
        _recomputing.depth += 1
        try:
            y = self.block(leaf)  # through __call__: pre/post hooks run again
        finally:
            _recomputing.depth -= 1
            self.rng.rewind(resume_at)
        y.backward(g)
        return leaf.grad
