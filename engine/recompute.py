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

Side losses. A module inside a block may also produce a scalar that the trainer adds to the loss outside the
block: a mixture of experts' load-balancing term (engine.moe.MoE keeps its last forward's as `aux_loss`).
Its gradient reaches the router inside the block, so the recompute must backpropagate it too. The forward
replaces each such term by a tape node hanging on the block's output node, whose backward only keeps the
gradient the term receives; the output node comes after it in backward (it feeds the term), and its recompute
backpropagates the recomputed block's output and terms together, from one root. The recompute runs the
block's forward again in full, so under expert parallelism its dispatch and combine all-to-alls are issued
(and metered) again. (The forward without a tape must give the bits the recompute's gives: engine.moe's
router renormalises by a product with the reciprocal for that.)

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
        self.side = side_loss_modules(block)

    def __call__(self, x: Tensor) -> Tensor:
        if recomputing() or not is_grad_enabled():
            return self.inner(x)  # the recompute itself, or evaluation without a tape
        position = self.rng.position()
        with no_grad():
            y = self.inner(x)
        x_data, needs_x = x.data, x.requires_grad
        edge = x if needs_x else Tensor(x_data, requires_grad=True)  # the node must exist for the params
        seeds: dict[int, np.ndarray] = {}  # side loss -> the gradient it received

        def backward(g):
            return (self._recompute_backward(x_data, g, position, seeds),)
        out = make(y.data, (edge,), backward, (x_data,))
        for i, module in enumerate(self.side):
            if module.aux_loss is not None:
                module.aux_loss = _side_loss_node(module.aux_loss, out, seeds, i)
        return out

    def _recompute_backward(self, x_data: np.ndarray, g: np.ndarray, position: tuple[int, int, int],
                            seeds: dict[int, np.ndarray]) -> np.ndarray | None:
        leaf = Tensor(x_data, requires_grad=True)
        resume_at = self.rng.position()
        before = [module.aux_loss for module in self.side]
        self.rng.rewind(position)
        _recomputing.depth += 1
        try:
            y = self.block(leaf)  # through __call__: pre/post hooks run again
        finally:
            _recomputing.depth -= 1
            self.rng.rewind(resume_at)
        terms = [self.side[i].aux_loss for i in sorted(seeds)]
        if terms:  # the output last among the root's inputs: backward's walk takes it first
            grads = [seeds[i] for i in sorted(seeds)]
            root = make(np.zeros((), y.dtype), (*terms, y), lambda _: (*grads, g))
            root.backward(np.zeros((), y.dtype))
        else:
            y.backward(g)
        seeds.clear()
        for module, term in zip(self.side, before):
            module.aux_loss = term
        return leaf.grad


def side_loss_modules(block) -> list:
    """The modules of `block` holding a side loss (an `aux_loss` attribute: engine.moe.MoE), in order."""
    return [m for m in block.modules() if "aux_loss" in vars(m)]


def _side_loss_node(term: Tensor, out: Tensor, seeds: dict[int, np.ndarray], i: int) -> Tensor:
    """`term`'s value as a node on the checkpointed block's output `out`: its backward keeps the gradient it
    receives in seeds[i] (the recompute backpropagates it) and passes nothing to the output."""
    def keep(g):
        seeds[i] = g
        return (None,)
    return make(term.data, (out,), keep)
