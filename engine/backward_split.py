"""Backward in two halves, for zero-bubble pipeline schedules: the input's gradient now, the weights' later.

A pipeline stage's previous stage waits only for the gradient of the stage's input; the weight gradients
can wait and fill the schedule's bubbles. `backward_input(root, grad)` runs, in the tape's usual reverse
topological order, only the nodes from which a non-Parameter leaf that needs a gradient (the stage's
input) can be reached, and ops called meanwhile hand back their weights' gradients unmade (tensor.Deferred:
linear's and a parameter matmul's products). Everything else waits: the gradients those nodes send towards
parameters, the Deferred products, and the nodes that lead only to parameters (the embedding).
`WeightBackward.run()` then walks the same order again, computing what waited exactly where backward would
have: every gradient is summed into each edge in backward's order, so the two halves give the bits that
one backward gives. A nested backward (a checkpointed block's recompute inside the input half) is split
the same way, its weight half run at its node's place in the outer one.

Memory: a node whose weight product waits keeps its saved arrays (the ledger sees them) until the weight
half; a node that only sends finished gradients on is freed in the input half. What the weight half itself
holds from the end of the input half to its own end — each deferred product's output gradient, the
finished gradients waiting to be summed into parameters, whatever `pending` still holds (a stage with no
input to differentiate keeps its seed) — is reported to the tape's observer (the memory ledger counts it
as activations) like one more node's saved arrays.
"""

from __future__ import annotations

import numpy as np

from engine.tensor import (
    Deferred,
    Node,
    Parameter,
    Tensor,
    _accumulate,
    _node_ids,
    _state,
    _topological,
    _write_leaf_grad,
    backward_step,
)


class WeightBackward:
    """The weight half of one split backward; `run()` it once."""

    def __init__(self, order: list, needed: set, pending: dict, waiting: dict):
        self.order, self.needed, self.pending, self.waiting = order, needed, pending, waiting
        self.observer, self.id = _state.observer, next(_node_ids)
        if self.observer is not None:
            self.observer.on_save(self.id, self._held())

    def _held(self) -> list:
        held = [entry[0] for entry in self.pending.values()]
        for sends, _ in self.waiting.values():
            for _, g in sends:
                held += g.holding() if isinstance(g, Deferred) else [g]
        return held

    def run(self) -> None:
        pending, waiting = self.pending, self.waiting
        for edge in self.order:
            if edge in self.needed:  # ran in the input half: what it sent towards the weights arrives now
                held = waiting.pop(edge, None)
                if held is not None:
                    sends, nested = held
                    for inner in nested:
                        inner.run()
                    for inp, g in sends:
                        g = g.value() if isinstance(g, Deferred) else g
                        if g is not None:  # a frozen weight's Deferred holds None
                            _accumulate(pending, inp, g, edge.fresh)
                    edge.free()
                continue
            backward_step(edge, pending)
        self.order, self.pending = [], {}
        if self.observer is not None:
            observer, self.observer = self.observer, None
            observer.on_free(self.id)


class _Nested(list):
    """Collects the weight halves of backwards nested in one node's backward (tensor.run_backward calls
    nest)."""

    def nest(self, root, grad: np.ndarray) -> None:
        self.append(backward_input(root, grad))


def backward_input(root, grad: np.ndarray) -> WeightBackward:
    """The input half: every gradient on the way to the non-Parameter leaves (written into their .grad);
    returns the weight half."""
    order = _topological(root)
    needed = _reaching_inputs(order)
    pending: dict = {root: (grad, False)}
    waiting: dict = {}  # node run here -> (its (input, gradient or Deferred) sends to weights, nested halves)
    for edge in order:
        if edge not in needed:
            continue
        entry = pending.pop(edge, None)
        if not isinstance(edge, Node):
            if entry is not None:
                _write_leaf_grad(edge, entry[0], entry[1])
            continue
        if edge.backward is None:
            raise RuntimeError("backward through a graph that was already freed (backward ran before)")
        if entry is None:
            edge.free()
            continue
        nested, outer = _Nested(), _state.split_collector
        _state.split_collector = nested
        try:
            grads = edge.backward(entry[0])
        finally:
            _state.split_collector = outer
        sends = []
        for inp, g in zip(edge.inputs, grads):
            if inp is None or g is None:
                continue
            if inp in needed:
                g = g.value() if isinstance(g, Deferred) else g
                if g is not None:
                    _accumulate(pending, inp, g, edge.fresh)
            else:
                sends.append((inp, g))
        if sends or nested:
            waiting[edge] = (sends, list(nested))
        if not (nested or any(isinstance(g, Deferred) for _, g in sends)):
            edge.free()  # nothing it saved is needed again
    return WeightBackward(order, needed, pending, waiting)


def _reaching_inputs(order: list) -> set:
    """The edges from which a leaf that needs a gradient and is not a Parameter can be reached."""
    needed: set = set()
    for edge in reversed(order):  # inputs before the nodes they feed
        if isinstance(edge, Node):
            if any(e is not None and e in needed for e in edge.inputs):
                needed.add(edge)
        elif isinstance(edge, Tensor) and not isinstance(edge, Parameter):
            needed.add(edge)
    return needed
