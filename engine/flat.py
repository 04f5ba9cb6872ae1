"""Flat buffers: many parameters packed into one contiguous 1-D array, each parameter a view into it.

Packing makes shards and buckets plain slices: ZeRO shards, DDP buckets, the optimizer and byte
accounting all work on ranges of one array. A parameter is anything with `.data` (ndarray, reassignable),
`.grad` (None or ndarray, reassignable) and `.name`.

Layout: parameters in the given order, then zero padding up to a multiple of `pad_to` (the world size,
so the buffer splits into equal shards; at most pad_to - 1 padding elements).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import ml_dtypes
import numpy as np

_DTYPES = {
    "fp16": np.float16, "float16": np.float16,
    "bf16": ml_dtypes.bfloat16, "bfloat16": ml_dtypes.bfloat16,
    "fp32": np.float32, "float32": np.float32,
    "fp64": np.float64, "float64": np.float64,
}


def resolve_dtype(dtype) -> np.dtype:
    """np.dtype from a config name ("fp16", "bf16", "fp32", "fp64", or the long names) or a dtype."""
    return np.dtype(_DTYPES.get(dtype, dtype) if isinstance(dtype, str) else dtype)


def master_dtype(dtype) -> np.dtype:
    """The optimizer's precision for a buffer dtype: float64 stays float64, everything else float32."""
    return np.dtype(np.float64) if resolve_dtype(dtype) == np.float64 else np.dtype(np.float32)


class Slot(NamedTuple):
    """Where one parameter lives in the flat buffer: elements [start, end), reshaped to shape."""
    name: str
    start: int
    end: int
    shape: tuple[int, ...]


class FlatBuffer:
    """Parameters (and optionally their gradients) packed into flat arrays, with per-parameter views."""

    def __init__(self, params, dtype=None, pad_to: int = 1, grad: bool = True):
        self.params = list(params)
        if not self.params:
            raise ValueError("FlatBuffer needs at least one parameter")
        self.dtype = resolve_dtype(self.params[0].data.dtype if dtype is None else dtype)
        self.slots: list[Slot] = []
        start = 0
        for p in self.params:
            shape = tuple(p.data.shape)
            self.slots.append(Slot(p.name, start, start + math.prod(shape), shape))
            start += math.prod(shape)
        self.numel = start
        self.size = -(-start // pad_to) * pad_to
        self.padding = self.size - self.numel
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self.data = np.zeros(self.size, dtype=self.dtype)
        for p, s in zip(self.params, self.slots):
            self.data[s.start:s.end] = np.asarray(p.data).reshape(-1).astype(self.dtype)
        self.grad = np.zeros(self.size, dtype=self.dtype) if grad else None
        self.bind()

    # ------------------------------------------------------------------ views

    def view(self, flat: np.ndarray, i: int) -> np.ndarray:
        """Parameter i's shaped view into any array laid out like this buffer (grad, master, m, v...)."""
        s = self.slots[i]
        return flat[s.start:s.end].reshape(s.shape)

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

    def zero_grad(self) -> None:
        self.grad.fill(0)

    # ------------------------------------------------------------------ shards

    def shard_range(self, rank: int, world: int) -> tuple[int, int]:
        """Elements [start, end) of rank's equal shard. The buffer must be padded to a multiple of world."""
        if self.size % world:
            raise ValueError(f"buffer of {self.size} elements does not split into {world} shards; "
                             f"build it with pad_to={world}")
        n = self.size // world
        return rank * n, (rank + 1) * n

    def shard(self, rank: int, world: int) -> np.ndarray:
        """View of rank's shard of the parameter buffer."""
        start, end = self.shard_range(rank, world)
        return self.data[start:end]

    def grad_shard(self, rank: int, world: int) -> np.ndarray:
        """View of rank's shard of the gradient buffer."""
        start, end = self.shard_range(rank, world)
        return self.grad[start:end]

    # ------------------------------------------------------------------ buckets

    def buckets(self, cap_bytes: float) -> list[tuple[int, int]]:
        """Contiguous element ranges in REVERSE parameter order (the order backward produces gradients),
        each at most cap_bytes unless a single parameter is larger (it then gets a bucket of its own).
        Boundaries fall on parameter boundaries; the padding joins the first bucket, so the ranges tile
        the whole buffer."""
        return [(start, end) for start, end, _ in self._plan_buckets(cap_bytes)]

    def bucket_map(self, cap_bytes: float) -> dict[int, int]:
        """id(param) -> index of its bucket in `buckets(cap_bytes)`."""
        return {id(self.params[i]): b for b, (_, _, members) in enumerate(self._plan_buckets(cap_bytes))
                for i in members}

    def _plan_buckets(self, cap_bytes: float) -> list[tuple[int, int, list[int]]]:
        itemsize = self.dtype.itemsize
        plan: list[tuple[int, int, list[int]]] = []
        end, members = self.size, []
        for i in reversed(range(len(self.params))):
            start = self.slots[i].start
            # Close the open bucket when adding parameter i would push it over the cap.
            if members and (end - start) * itemsize > cap_bytes:
                plan.append((self.slots[members[-1]].start, end, members))
                end, members = self.slots[members[-1]].start, []
            members.append(i)
        plan.append((0, end, members))
        return plan

    # ------------------------------------------------------------------ master copies and masks

    @property
    def master_dtype(self) -> np.dtype:
        return master_dtype(self.dtype)

    def decay_mask(self) -> np.ndarray:
        """Flat boolean mask: weight decay on parameters with ndim >= 2 (nanoGPT), not biases/LayerNorm,
        not padding."""
        mask = np.zeros(self.size, dtype=bool)
        for s in self.slots:
            mask[s.start:s.end] = len(s.shape) >= 2
        return mask
