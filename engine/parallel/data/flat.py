"""Flat layouts and buffers: many parameters packed into one contiguous 1-D array, each a view into it.

Packing makes shards and buckets plain slices: ZeRO shards, DDP buckets, the optimizer and byte
accounting all work on ranges of one array.

`FlatLayout` is where every parameter sits — parameters in the given order, then zero padding up to a
multiple of `pad_to` (the world size, so the buffer splits into equal shards; at most pad_to - 1 padding
elements) — and how it cuts into buckets and shards. It holds no arrays: the estimator plans with it,
ZeRO-3 keeps one as the standard layout checkpoints use. `FlatBuffer` is a layout with its arrays, bound
to real parameters (anything with `.data` (ndarray, reassignable), `.grad` (None or ndarray,
reassignable) and `.name`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from engine.comm.shard import shard_bounds
from engine.dtypes import master_dtype, resolve_dtype


class Slot(NamedTuple):
    """Where one parameter lives in the flat buffer: elements [start, end), reshaped to shape."""
    name: str
    start: int
    end: int
    shape: tuple[int, ...]


class FlatLayout:
    """Slots of (name, shape) pairs packed in order and padded to a multiple of `pad_to`; no arrays."""

    def __init__(self, shapes, dtype, pad_to: int = 1):
        self.dtype = resolve_dtype(dtype)
        self.slots: list[Slot] = []
        start = 0
        for name, shape in shapes:
            shape = tuple(shape)
            self.slots.append(Slot(name, start, start + math.prod(shape), shape))
            start += math.prod(shape)
        self.numel = start
        self.size = -(-start // pad_to) * pad_to
        self.padding = self.size - self.numel

    @property
    def master_dtype(self) -> np.dtype:
        return master_dtype(self.dtype)

    def view(self, flat: np.ndarray, i: int) -> np.ndarray:
        """Parameter i's shaped view into any array laid out like this one (data, grad, master, m, v...)."""
        s = self.slots[i]
        return flat[s.start:s.end].reshape(s.shape)

    def shard_range(self, rank: int, world: int) -> tuple[int, int]:
        """Elements [start, end) of rank's equal shard. The layout must be padded to a multiple of world."""
        if self.size % world:
            raise ValueError(f"buffer of {self.size} elements does not split into {world} shards; "
                             f"build it with pad_to={world}")
        return shard_bounds(self.size, world, rank)

    def buckets(self, cap_bytes: float) -> list[tuple[int, int]]:
        """Contiguous element ranges in REVERSE parameter order (the order backward produces gradients),
        each at most cap_bytes unless a single parameter is larger (it then gets a bucket of its own).
        Boundaries fall on parameter boundaries; the padding joins the first bucket, so the ranges tile
        the whole buffer."""
        return [(start, end) for start, end, _ in self.bucket_plan(cap_bytes)]

    def bucket_plan(self, cap_bytes: float) -> list[tuple[int, int, list[int]]]:
        """(start, end, indices of the parameters inside) of every bucket of `buckets(cap_bytes)`."""
        itemsize = self.dtype.itemsize
        plan: list[tuple[int, int, list[int]]] = []
        end = self.size
        members: list[int] = []
        for i in reversed(range(len(self.slots))):
            start = self.slots[i].start
            # Close the open bucket when adding parameter i would push it over the cap.
            if members and (end - start) * itemsize > cap_bytes:
                plan.append((self.slots[members[-1]].start, end, members))
                end, members = self.slots[members[-1]].start, []
            members.append(i)
        plan.append((0, end, members))
        return plan

    def decay_mask(self) -> np.ndarray:
        """Flat boolean mask: weight decay on parameters with ndim >= 2 (nanoGPT), not biases/LayerNorm,
        not padding."""
        mask = np.zeros(self.size, dtype=bool)
        for s in self.slots:
            mask[s.start:s.end] = len(s.shape) >= 2
        return mask


class FlatBuffer(FlatLayout):
    """Parameters (and optionally their gradients) packed into flat arrays, with per-parameter views."""

    def __init__(self, params, dtype=None, pad_to: int = 1, grad: bool = True):
        self.params = list(params)
        if not self.params:
            raise ValueError("FlatBuffer needs at least one parameter")
        super().__init__([(p.name, np.shape(p.data)) for p in self.params],
                         self.params[0].data.dtype if dtype is None else dtype, pad_to)
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self.data = np.zeros(self.size, dtype=self.dtype)
        for p, s in zip(self.params, self.slots):
            self.data[s.start:s.end] = np.asarray(p.data).reshape(-1).astype(self.dtype)
        self.grad = np.zeros(self.size, dtype=self.dtype) if grad else None
        self.bind()

    @property
    def grad_buffer(self) -> np.ndarray:
        """`grad` of a buffer built with grad=True; a ValueError for one built without."""
        if self.grad is None:
            raise ValueError("this FlatBuffer was built with grad=False: it has no gradient buffer")
        return self.grad

    def bind(self) -> None:
        """Point every p.data (and p.grad, when a grad buffer exists) at its view. Called on construction;
        call again after anything reassigned them (e.g. after refilling a freed ZeRO-3 buffer)."""
        for i, p in enumerate(self.params):
            p.data = self.view(self.data, i)
            if self.grad is not None:
                p.grad = self.view(self.grad, i)

    def index_of(self, param) -> int:
        """Position of a parameter in the layout (by identity)."""
        return self._index[id(param)]

    def mark_grads_stale(self) -> None:
        """Start a step's backward without clearing the gradient buffer: each parameter's first gradient
        of the step is written over its old values (engine.tensor), and zero_stale() clears those that
        got none. One pass over the buffer fewer than clearing it and adding to zeros: the gradient
        buffer is as large as the parameters, and these passes are bound by memory bandwidth. The
        padding is never written, so it stays zero."""
        for p in self.params:
            p.grad_stale = True

    def zero_stale(self) -> None:
        """Zero the gradients of parameters that backward has not written since mark_grads_stale() (a
        parameter this step did not use): the buffer then holds exactly what clearing it before backward
        would have left."""
        for p in self.params:
            if p.grad_stale:
                p.grad[...] = 0
                p.grad_stale = False

    def shard(self, rank: int, world: int) -> np.ndarray:
        """View of rank's shard of the parameter buffer."""
        return self.data[slice(*self.shard_range(rank, world))]

    def grad_shard(self, rank: int, world: int) -> np.ndarray:
        """View of rank's shard of the gradient buffer."""
        return self.grad_buffer[slice(*self.shard_range(rank, world))]

    def bucket_map(self, cap_bytes: float) -> dict[int, int]:
        """id(param) -> index of its bucket in `buckets(cap_bytes)`."""
        return {id(self.params[i]): b for b, (_, _, members) in enumerate(self.bucket_plan(cap_bytes))
                for i in members}
