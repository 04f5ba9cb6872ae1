"""Tensor, Parameter and the reverse-mode tape.

A Tensor wraps a NumPy array. When an op runs with grad enabled and one of its inputs needs a
gradient, the op records a `Node`: the edges to its inputs and a closure that maps the output's
gradient to the inputs' gradients. Nodes point at other nodes (or at leaf tensors), never at the
intermediate tensors, so an activation stays alive only while some backward closure keeps it —
and those arrays are exactly what the op lists in `saved=` for the memory ledger.

Operator overloads (+, *, @, indexing, .reshape, ...) are installed by `engine.ops`.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.fast import lowp


class _TapeState(threading.local):
    """Per-thread tape settings: ranks run as threads, each with its own mode and observer."""

    grad_enabled = True
    observer = None
    # Inside the input half of a split backward (engine.backward_split): what collects the weight halves of
    # backwards nested in it (a checkpointed block's recompute), by its `nest(root, grad)`; None otherwise.
    # Ops read it through deferring_weights() to return their weight gradients as Deferred.
    split_collector: Any = None


_state = _TapeState()
_node_ids = itertools.count()


@contextmanager
def no_grad():
    """Inside this block ops create no nodes (evaluation, recomputation without a tape)."""
    previous = _state.grad_enabled
    _state.grad_enabled = False
    try:
        yield
    finally:
        _state.grad_enabled = previous


def is_grad_enabled() -> bool:
    return _state.grad_enabled


def deferring_weights() -> bool:
    """Whether an op's backward should return its weights' gradients as Deferred (see Deferred)."""
    return _state.split_collector is not None


def set_tape_observer(observer) -> None:
    """Install this thread's observer: `on_save(node_id, arrays)` and `on_free(node_id)`; None removes it."""
    _state.observer = observer


class Tensor:
    """An array with an optional gradient. `.grad` is None or an array of `.data`'s dtype and shape."""

    __slots__ = ("data", "grad", "requires_grad", "_node", "__weakref__")
    __array_ufunc__ = None  # `ndarray + Tensor` defers to Tensor.__radd__ instead of making an object array

    def __init__(self, data, requires_grad: bool = False):
        self.data: np.ndarray = data if isinstance(data, np.ndarray) else np.asarray(data)
        self.grad: np.ndarray | None = None
        self.requires_grad = requires_grad
        self._node: Node | None = None

    shape = property(lambda self: self.data.shape)
    dtype = property(lambda self: self.data.dtype)
    ndim = property(lambda self: self.data.ndim)
    size = property(lambda self: self.data.size)

    if TYPE_CHECKING:
        # Installed at import time by engine.ops._install_operators (ops builds on this module, so the
        # definitions cannot live here); declared for the type checker only. Operands: Tensor or scalar.
        def __add__(self, other: Any) -> Tensor: ...
        def __radd__(self, other: Any) -> Tensor: ...
        def __sub__(self, other: Any) -> Tensor: ...
        def __rsub__(self, other: Any) -> Tensor: ...
        def __mul__(self, other: Any) -> Tensor: ...
        def __rmul__(self, other: Any) -> Tensor: ...
        def __truediv__(self, other: Any) -> Tensor: ...
        def __rtruediv__(self, other: Any) -> Tensor: ...
        def __neg__(self) -> Tensor: ...
        def __pow__(self, exponent: float) -> Tensor: ...
        def __matmul__(self, other: Tensor) -> Tensor: ...
        def __getitem__(self, index: Any) -> Tensor: ...
        def reshape(self, *shape: Any) -> Tensor: ...
        def transpose(self, *axes: Any) -> Tensor: ...
        def sum(self, axis: Any = None, keepdims: bool = False) -> Tensor: ...
        def mean(self, axis: Any = None, keepdims: bool = False) -> Tensor: ...
        def astype(self, dtype: Any) -> Tensor: ...
        @property
        def T(self) -> Tensor: ...

    def item(self) -> float:
        return self.data.item()

    def numpy(self) -> np.ndarray:
        return self.data

    def detach(self) -> Tensor:
        return Tensor(self.data)

    def __repr__(self) -> str:
        return f"Tensor(shape={self.shape}, dtype={self.dtype}, requires_grad={self.requires_grad})"

    def backward(self, grad: np.ndarray | None = None) -> None:
        """Accumulate d(self)/d(leaf) into every leaf's `.grad`; `grad` defaults to 1 for a scalar."""
        if not self.requires_grad:
            raise RuntimeError("backward() on a tensor that does not require grad")
        if grad is None:
            if self.data.size != 1:
                raise RuntimeError(f"backward() needs a gradient for a non-scalar of shape {self.shape}")
            grad = np.ones_like(self.data)
        run_backward(self._node or self, np.asarray(grad, dtype=self.dtype))


class Parameter(Tensor):
    """A trainable leaf. `.name` is set by its model; grad-ready hooks fire once per backward.
    `grad_stale`: `.grad` holds an earlier step's values, which the next gradient written replaces rather
    than adds to (engine.parallel.data.flat.FlatBuffer.mark_grads_stale)."""

    __slots__ = ("name", "_grad_ready_hooks", "grad_stale")

    def __init__(self, data, name: str | None = None):
        super().__init__(data, requires_grad=True)
        self.name = name
        self.grad_stale = False
        self._grad_ready_hooks: list[Callable[[Parameter], None]] = []

    def register_grad_ready_hook(self, fn: Callable[[Parameter], None]) -> Callable[[], None]:
        """fn(param) runs when this backward has finished adding to `param.grad`; returns a remover."""
        self._grad_ready_hooks.append(fn)
        return lambda: self._grad_ready_hooks.remove(fn)

    def __repr__(self) -> str:
        return f"Parameter({self.name!r}, shape={self.shape}, dtype={self.dtype})"


class Node:
    """One recorded op: edges to its inputs (Node, leaf Tensor, or None) and its backward closure.
    `fresh`: the arrays the closure returns are its own (see make)."""

    __slots__ = ("id", "inputs", "backward", "observer", "fresh")

    def __init__(self, inputs: tuple, backward: Callable, saved: tuple, fresh: bool = False):
        self.id = next(_node_ids)
        self.inputs = inputs
        self.backward: Callable | None = backward
        self.fresh = fresh
        self.observer = _state.observer if saved else None
        if self.observer is not None:
            self.observer.on_save(self.id, saved)

    def free(self) -> None:
        """Drop the closure (and with it the saved arrays) and the edges; tell the observer once."""
        self.backward = None
        self.inputs = ()
        if self.observer is not None:
            observer, self.observer = self.observer, None
            observer.on_free(self.id)

    def __del__(self):  # a graph dropped without backward (e.g. an abandoned forward) still frees
        if self.observer is not None:
            self.free()


class Deferred:
    """A weight gradient not computed yet: what an op's backward returns for its weights while
    deferring_weights(), so that a split backward's input half skips the product and its weight half
    (engine.backward_split) computes it later, with the same arithmetic. `value()` computes it (once for all
    the Deferred of one call, which share `compute`)."""

    __slots__ = ("_cell", "_index")

    def __init__(self, cell: list, index: int):
        self._cell, self._index = cell, index

    def value(self):
        cell = self._cell
        if callable(cell[0]):
            cell[0], cell[1] = cell[0](), ()  # the gradients, computed by the first of the group asked
        return cell[0][self._index]

    def holding(self) -> tuple:
        """The arrays `compute` keeps until it runs (what a split backward's weight half holds: the memory
        ledger counts them); () once computed."""
        return self._cell[1]


def defer(compute: Callable[[], tuple], n: int, holds: tuple = ()) -> tuple[Deferred, ...]:
    """n Deferred gradients, the parts of `compute()`'s tuple, computed together on the first value();
    `holds`: the arrays compute keeps (besides its op's saved ones) until then."""
    cell: list = [compute, holds]
    return tuple(Deferred(cell, i) for i in range(n))


class ScatterGrad:
    """A gradient that is zero except at `index` (from indexing/embedding): scattered into the buffer."""

    __slots__ = ("index", "values", "shape", "dtype")

    def __init__(self, index, values: np.ndarray, shape: tuple, dtype):
        self.index, self.values, self.shape, self.dtype = index, values, shape, dtype

    def write_into(self, zeros: np.ndarray) -> None:
        """add_into a buffer of zeros: basic indexing (a slice, as split's parts are) copies the values
        instead of adding them to zeros, which in 16 bits would widen and round both for nothing (the same
        values, except that a -0.0 stays -0.0 where 0 + -0.0 gave +0.0: equal, and equal in every sum)."""
        if _is_basic(self.index):
            zeros[self.index] = self.values
        else:
            self.add_into(zeros)

    def add_into(self, buf: np.ndarray) -> None:
        idx = self.index
        if isinstance(idx, np.ndarray) and idx.dtype.kind in "iu":
            rows = np.mod(idx.reshape(-1), buf.shape[0])  # -1 and n-1 are the same row
            _add_rows(buf, rows, self.values.reshape(idx.size, *buf.shape[1:]))
        elif not _is_basic(idx):
            np.add.at(buf, idx, self.values)  # general advanced indexing: repeated indices must add up
        else:  # basic indexing (slices, ints) never repeats an element
            view = buf[idx]
            lowp.add(view, self.values, out=view)


def _is_basic(index) -> bool:
    """Whether `index` is basic indexing (slices, ints, None, Ellipsis: a view, no element twice)."""
    parts = index if isinstance(index, tuple) else (index,)
    return not any(isinstance(i, (np.ndarray, list)) for i in parts)


def _add_rows(buf: np.ndarray, rows: np.ndarray, values: np.ndarray) -> None:
    """buf[rows[i]] += values[i] with repeats summed; sort + reduceat is ~6x faster than np.add.at.
    16-bit values are summed in float32 and each row rounded once. No rows (an index that picks nothing,
    as an expert no token reached has) add nothing."""
    if rows.size == 0:
        return
    order = np.argsort(rows, kind="stable")
    sorted_rows = rows[order]
    starts = np.flatnonzero(np.r_[True, sorted_rows[1:] != sorted_rows[:-1]])
    target = sorted_rows[starts]
    sums = np.add.reduceat(lowp.widen(values[order]), starts, axis=0)
    sums += lowp.widen(buf[target])
    buf[target] = lowp.narrow(sums, buf.dtype)


def make(data: np.ndarray, inputs: tuple, backward: Callable, saved: tuple = (), fresh: bool = False
         ) -> Tensor:
    """Wrap an op's result, recording a node when grad is enabled and some input requires grad.

    `backward(g)` returns one gradient (ndarray, ScatterGrad or None) per input; it must treat `g`
    as read-only. `saved` lists exactly the activation arrays the closure keeps (for the ledger).
    `fresh`: every array `backward` returns is new, a different one per input, and kept by nothing else
    (nor a view of anything kept), so the tape may add another gradient into it in place.
    """
    if not (_state.grad_enabled and any(t.requires_grad for t in inputs)):
        return Tensor(data)
    out = Tensor(data, requires_grad=True)
    edges = tuple((t._node or t) if t.requires_grad else None for t in inputs)
    out._node = Node(edges, backward, saved, fresh)
    return out


def _topological(root) -> list:
    """Edges (nodes and leaves) ordered so that every edge comes after all the edges it feeds into.

    Leaves are explored last, which puts each parameter right after the op that last uses it in
    reverse order: its grad-ready hook then fires as early as possible during backward.
    """
    order, seen, stack = [], set(), [(root, False)]
    while stack:
        edge, expanded = stack.pop()
        if expanded:
            order.append(edge)
            continue
        if edge in seen:
            continue
        seen.add(edge)
        stack.append((edge, True))
        if isinstance(edge, Node):
            stack.extend((e, False) for e in edge.inputs if isinstance(e, Tensor) and e not in seen)
            stack.extend((e, False) for e in edge.inputs if isinstance(e, Node) and e not in seen)
    order.reverse()
    return order


def _accumulate(pending: dict, edge, grad, fresh: bool = False) -> None:
    """Sum gradients arriving at one edge. Arrays we allocated, or a node handed over as `fresh`
    ("owned"), are added to in place (an unowned gradient is added into a fresh one: a + b is b + a,
    bit for bit); others may alias another edge's gradient, so the first sum of two of them makes a new
    array. A buffer of zeros that only slices have been written into (split's parts) keeps the list of
    those slices: a part that overlaps none of them is copied in, not added to zeros."""
    previous = pending.get(edge)
    if isinstance(grad, ScatterGrad):
        if previous is None:
            buf = np.zeros(grad.shape, grad.dtype)
            grad.write_into(buf)
            written = [grad.index] if _slices_only(grad.index) else None
        else:
            buf = previous[0] if previous[1] else previous[0].copy()
            written = previous[2] if len(previous) > 2 else None
            if written is not None and _slices_only(grad.index) and not any(
                    _overlap(grad.index, w, buf.shape) for w in written):
                buf[grad.index] = grad.values
                written = written + [grad.index]
            else:
                grad.add_into(buf)
                written = None
        pending[edge] = (buf, True) if written is None else (buf, True, written)
    elif previous is None:
        pending[edge] = (grad, fresh)
    elif previous[1]:
        lowp.add(previous[0], grad, out=previous[0])
        if len(previous) > 2:
            pending[edge] = previous[:2]  # no longer zeros outside its slices
    elif fresh:
        pending[edge] = (lowp.add(grad, previous[0], out=grad), True)
    else:
        pending[edge] = (lowp.add(previous[0], grad), True)


def _slices_only(index) -> bool:
    """An index of slices without steps (what split makes): its region is a box."""
    parts = index if isinstance(index, tuple) else (index,)
    return all(isinstance(i, slice) and i.step in (None, 1) for i in parts)


def _overlap(a, b, shape: tuple) -> bool:
    """Whether the boxes of two slices-only indexes into an array of `shape` share an element."""
    a, b = (i if isinstance(i, tuple) else (i,) for i in (a, b))
    for axis, n in enumerate(shape):
        ra = a[axis].indices(n) if axis < len(a) else (0, n, 1)
        rb = b[axis].indices(n) if axis < len(b) else (0, n, 1)
        if max(ra[0], rb[0]) >= min(ra[1], rb[1]):
            return False  # disjoint along this axis
    return True


def run_backward(root, grad: np.ndarray) -> None:
    """Run every node reachable from `root` once, in reverse topological order, then free it."""
    if _state.split_collector is not None:  # nested in a split backward's input half (a recompute's):
        _state.split_collector.nest(root, grad)  # split too; its weight half runs with the outer's
        return
    pending = {root: (grad, False)}
    for edge in _topological(root):
        backward_step(edge, pending)


def backward_step(edge, pending: dict) -> None:
    """One step of a backward walk: a node runs on the gradient pending for it (if any), passes its inputs'
    gradients on into `pending`, and frees what it saved; a leaf takes its pending gradient."""
    entry = pending.pop(edge, None)
    if isinstance(edge, Node):
        if edge.backward is None:
            raise RuntimeError("backward through a graph that was already freed (backward ran before)")
        if entry is not None:
            grads = edge.backward(entry[0])
            for inp, g in zip(edge.inputs, grads):
                if inp is not None and g is not None:
                    _accumulate(pending, inp, g, edge.fresh)
        edge.free()
    elif entry is not None:
        _write_leaf_grad(edge, entry[0], entry[1])


def _write_leaf_grad(leaf: Tensor, grad: np.ndarray, owned: bool) -> None:
    if leaf.grad is None:
        leaf.grad = grad.astype(leaf.dtype, copy=not owned)
    elif getattr(leaf, "grad_stale", False):
        # a flat buffer's view (engine.parallel.data.flat), not cleared for this step
        lowp.copy_into(grad, leaf.grad)
        leaf.grad_stale = False  # type: ignore[attr-defined]
    else:
        lowp.add(leaf.grad, grad, out=leaf.grad)  # in place: .grad may be a view into a flat gradient buffer
    for hook in getattr(leaf, "_grad_ready_hooks", ()):
        hook(leaf)
