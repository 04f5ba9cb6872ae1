"""ZeRO stage 3: parameters sharded too, gathered layer by layer just before use and freed after.

Units: each of the model's `units()` (GPT blocks, MLP layers) is one unit; every parameter outside
them (embeddings, final LayerNorm, the head, whose weight is tied to the token embedding) forms one
outer unit owned by the model itself. Each unit has its own flat layout padded to a multiple of N
(engine.parallel.data.flat), and rank r keeps only part r of it: model-dtype parameters, gradients, and the
optimizer state for them (engine.parallel.data.shard_optimizer; the parts of all units are views of one
local array per kind).

Life of a unit in a step (hooks on the unit's module; the model code knows nothing of this):
  forward pre-hook    all-gather the unit (or wait for its prefetch) and bind the parameters to it;
                      prefetch the next unit in forward order (`parallel.prefetch`)
  forward post-hook   free the gathered buffer (parameters become empty arrays) and wrap the output in
                      `ops.backward_hook`, whose backward gathers the unit again (pinned for backward)
                      and prefetches the next unit in backward order
  grad-ready hooks    when all the unit's gradients are final: copy them into a buffer, drop p.grad,
                      reduce-scatter the buffer on the communication thread and add part r into the
                      gradient shard; free the unit's parameters
The outer unit is gathered when the model's forward starts and freed when it ends; in backward it is
gathered at the logits and kept until its last gradient (the token embedding's, at the very end: with
tied weights that gradient is only final then). So a rank holds the outer unit plus one or two blocks.

Activation checkpointing (engine.recompute) re-runs a block through its `__call__` inside backward:
the pre-hook finds the unit already gathered for backward, the post-hook leaves it pinned, and the
unit is freed when its gradients are reduced, so recomputation costs no extra gather.

Traffic per step and micro-batch: two all-gathers (forward, backward) and one reduce-scatter of every
unit = 3Ψ'(N−1)/N elements per rank, Ψ' = Ψ plus each unit's padding (< N per unit). The meter shows
the parameter gathers under the collectives' own phase name, "all-gather" (there is no all-gather after
the update: the next forward gathers the new parameters).
"""

from __future__ import annotations

import time
from functools import partial

import numpy as np

from engine import ops
from engine.comm.collectives import broadcast
from engine.comm.meter import metered_phase
from engine.dtypes import resolve_dtype
from engine.parallel.data.buckets import part
from engine.parallel.data.flat import FlatBuffer, FlatLayout
from engine.parallel.data.replica import ShardedReplica
from engine.parallel.data.shard_optimizer import Piece
from engine.parallel.data.worker import CommTask
from engine.tensor import Tensor


class _Unit:
    """One gatherable group of parameters and this rank's part of it."""

    def __init__(self, module, params, flat, part_range, shard, grad_shard):
        self.module, self.params, self.flat = module, params, flat
        self.part, self.shard, self.grad_shard = part_range, shard, grad_shard
        self.job: CommTask | None = None  # the gather in flight (state "pending")
        self.state = "free"  # free | pending (gather in flight) | ready (parameters bound)
        self.pinned = False  # gathered for backward: stays until its gradients are reduced
        self.ready = 0  # parameters whose gradient is final in this micro-batch
        self.reduced = False


class Zero3Replica(ShardedReplica):
    """Parameters sharded per unit. Piece and group i are this rank's part of unit i and the unit's whole
    padded layout; `flat` is the standard layout (parameter order, padded to N) checkpoints use: stage
    3 has no full buffer, so it holds no data."""

    def __init__(self, cfg, model, comm):
        super().__init__(cfg, model, comm)
        dtype = resolve_dtype(cfg.precision.dtype)
        self.flat = FlatLayout([(p.name, p.shape) for p in self.params], dtype, self.shards)
        self._std_start = {id(p): s.start for p, s in zip(self.params, self.flat.slots)}
        self._empty = np.empty(0, dtype=dtype)
        self.units = self._build_units(model, dtype)
        self.groups = [(0, u.flat.size) for u in self.units]
        self._unit_of = {id(p): u for u in self.units for p in u.params}
        self.param_shard = np.concatenate([u.shard for u in self.units])
        self.grad_shard = np.zeros_like(self.param_shard)
        offset = 0
        for u in self.units:  # the units' parts become views of one local array per kind
            n = u.shard.size
            u.shard, u.grad_shard = self.param_shard[offset:offset + n], self.grad_shard[offset:offset + n]
            offset += n
        self.ledger.hold("parameters", self.param_shard.nbytes)
        self.ledger.hold("gradients", self.grad_shard.nbytes)
        self.prefetch = cfg.parallel.prefetch
        outer = [u for u in self.units if u.module is model]
        blocks = [u for u in self.units if u.module is not model]
        self._forward_order = outer + blocks
        self._backward_order = outer + blocks[::-1]
        self._in_backward = False
        self._start(cfg, [Piece(u.shard, u.grad_shard, u.flat, u.part[0]) for u in self.units], sharded=True)
        for u in self.units:
            pre, post = (lambda m, u=u: self._pre(u)), (lambda m, out, u=u: self._post(u, out))
            u.module.forward_pre_hooks.append(pre)
            u.module.forward_post_hooks.append(post)
            self._remove_hooks += [partial(u.module.forward_pre_hooks.remove, pre),
                                   partial(u.module.forward_post_hooks.remove, post)]

    def _build_units(self, model, dtype) -> list[_Unit]:
        """Shard every unit: pack it (padded to N), start from rank 0's values, keep part r, free it."""
        modules = model.units()
        groups = [(m, m.parameters()) for m in modules]
        inside = {id(p) for _, ps in groups for p in ps}
        outer = [p for p in self.params if id(p) not in inside]
        if outer:
            groups.insert(0, (model, outer))
        units = []
        for module, params in groups:
            flat = FlatBuffer(params, dtype=dtype, pad_to=self.shards, grad=False)
            if self.world > 1:
                broadcast(self.comm, flat.data, root=0)
            lo, hi = part(0, flat.size, self.shard_rank, self.shards)
            units.append(_Unit(module, params, flat, (lo, hi), flat.data[lo:hi].copy(), None))
            for p in params:
                p.data = self._empty
            flat.data = self._empty
        return units

    # ------------------------------------------------------------------ gathering and freeing

    def _start_gather(self, u: _Unit) -> None:
        buf = np.empty(u.flat.size, dtype=u.shard.dtype)
        self.ledger.add("parameters", buf.nbytes)
        buf[u.part[0]:u.part[1]] = u.shard
        u.flat.data = buf
        u.job = self._worker.submit(lambda: self._gather(buf))
        u.state = "pending"

    def _gather(self, buf: np.ndarray) -> None:
        """All-gather one unit's parameters; the meter books it as "param-gather" (stage 3's extra Ψ)."""
        with metered_phase(self.comm.meter, "param-gather"):
            self.topology.all_gather(buf)

    def _ensure(self, u: _Unit, pin: bool) -> None:
        if u.state == "free":
            self._start_gather(u)
        if u.state == "pending":
            assert u.job is not None  # set with state "pending"
            t0 = time.perf_counter()
            u.job.wait()
            self.comm_wait_s += time.perf_counter() - t0
            u.flat.bind()
            u.state = "ready"
        u.pinned = u.pinned or pin

    def _free(self, u: _Unit) -> None:
        if u.state == "free":
            return
        if u.state == "pending":
            assert u.job is not None  # set with state "pending"
            u.job.wait()
        for p in u.params:
            p.data = self._empty
        self.ledger.sub("parameters", u.flat.data.nbytes)
        u.flat.data, u.state, u.pinned = self._empty, "free", False

    def _prefetch_after(self, u: _Unit) -> None:
        order = self._backward_order if self._in_backward else self._forward_order
        i = order.index(u) + 1
        if not self.prefetch or i == len(order) or order[i].state != "free":
            return
        if not (self._in_backward and order[i].reduced):  # in backward, done units stay freed
            self._start_gather(order[i])

    def _pre(self, u: _Unit) -> None:
        self._ensure(u, pin=self._in_backward)
        self._prefetch_after(u)

    def _post(self, u: _Unit, out):
        if not u.pinned:
            self._free(u)
        if isinstance(out, Tensor) and out.requires_grad:
            return ops.backward_hook(out, lambda: self._before_backward(u))
        return None

    def _before_backward(self, u: _Unit) -> None:
        self._ensure(u, pin=True)
        self._prefetch_after(u)

    # ------------------------------------------------------------------ gradients

    def zero_grad(self) -> None:
        self.grad_shard.fill(0)
        self.comm_wait_s = 0.0

    def begin_micro(self, sync: bool) -> None:
        """Every micro-batch reduce-scatters into the gradient shard (no full gradient in between)."""
        for u in self.units:
            u.ready, u.reduced = 0, False

    def backward(self, loss, factor: float) -> None:
        self._in_backward = True
        try:
            super().backward(loss, factor)
        finally:
            self._in_backward = False
        for u in self._backward_order:  # units with unused parameters: reduce what there is
            if not u.reduced:
                self._reduce(u)

    def _on_grad_ready(self, p) -> None:
        u = self._unit_of[id(p)]
        self.ledger.add("gradients", p.grad.nbytes)
        u.ready += 1
        if u.ready == len(u.params):
            self._reduce(u)

    def _reduce(self, u: _Unit) -> None:
        self._reduce_into_shard(self.units.index(u), lambda buf: self._pack(u, buf))
        u.reduced = True
        self._free(u)  # every use of these parameters in this backward is behind us

    def _pack(self, u: _Unit, buf: np.ndarray) -> None:
        """Copy the unit's gradients (zeros where a parameter has none) into its buffer; drop p.grad."""
        for i, p in enumerate(u.params):
            if p.grad is not None:
                u.flat.view(buf, i)[...] = p.grad
                self.ledger.sub("gradients", p.grad.nbytes)
                p.grad = None

    # ------------------------------------------------------------------ checkpoint state

    def _keep_owned(self, i: int, whole: np.ndarray, out: np.ndarray, start: int, end: int) -> None:
        """Unit layouts differ from the standard one: move each parameter's overlap with [start, end)."""
        u = self.units[i]
        for p, slot in zip(u.params, u.flat.slots):
            std = self._std_start[id(p)]
            x, y = max(start, std), min(end, std + slot.end - slot.start)
            if x < y:
                out[x - start:y - start] = whole[slot.start + x - std:slot.start + y - std]

    def load_optimizer_state(self, full: dict) -> None:
        """Set this rank's parts (master, m, v, parameters) and the step from unpadded full arrays."""
        local = {}
        for key in ("master", "m", "v"):
            parts = []
            for u in self.units:
                tmp = np.zeros(u.flat.size, dtype=self.optimizer.m.dtype)
                for p, slot in zip(u.params, u.flat.slots):
                    std = self._std_start[id(p)]
                    tmp[slot.start:slot.end] = full[key][std:std + slot.end - slot.start]
                parts.append(tmp[u.part[0]:u.part[1]])
            local[key] = np.concatenate(parts)
        self.optimizer.load_local(local["master"], local["m"], local["v"], full["step"])
