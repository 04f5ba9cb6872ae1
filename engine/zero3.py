"""ZeRO stage 3: parameters sharded too, gathered layer by layer just before use and freed after.

Units: each GPT block (each MLP layer) is one unit; every parameter outside them (embeddings, final
LayerNorm, the head, whose weight is tied to the token embedding) forms one outer unit owned by the
model itself. Each unit has its own flat layout padded to a multiple of N (engine.flat), and rank r
keeps only part r of it: model-dtype parameters, gradients, and the optimizer state for them
(engine.zero_shard; the parts of all units are views of one local array per kind).

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

import numpy as np

from engine import ops
from engine.amp import make_scaler
from engine.comm.collectives import all_gather, broadcast, reduce_scatter
from engine.flat import FlatBuffer, Slot, resolve_dtype
from engine.tensor import Tensor
from engine.zero_comm import CommWorker, part, rank_ledger
from engine.zero_shard import Piece, ShardOptimizer


class StandardLayout:
    """Where every parameter sits in the standard flat layout (parameter order, padded to a multiple of
    N): the layout checkpoints use. Holds no parameter data — stage 3 has no full buffer."""

    def __init__(self, params, dtype, world: int):
        self.params, self.dtype, self.slots, start = params, resolve_dtype(dtype), [], 0
        for p in params:
            self.slots.append(Slot(p.name, start, start + p.data.size, tuple(p.data.shape)))
            start += p.data.size
        self.numel = start
        self.size = -(-start // world) * world
        self.padding = self.size - self.numel


class _Unit:
    """One gatherable group of parameters and this rank's part of it."""

    def __init__(self, module, params, flat, part_range, shard, grad_shard):
        self.module, self.params, self.flat = module, params, flat
        self.part, self.shard, self.grad_shard = part_range, shard, grad_shard
        self.job = None
        self.state = "free"  # free | pending (gather in flight) | ready (parameters bound)
        self.pinned = False  # gathered for backward: stays until its gradients are reduced
        self.ready = 0  # parameters whose gradient is final in this micro-batch
        self.reduced = False


class Zero3Replica:
    """The replica interface of engine.ddp.DataParallel, with parameters sharded per unit."""

    def __init__(self, cfg, model, comm):
        self.comm, self.rank, self.world = comm, comm.rank, comm.world_size
        self.ledger = rank_ledger()
        self.params = model.parameters()
        dtype = resolve_dtype(cfg.precision.dtype)
        self.flat = StandardLayout(self.params, dtype, self.world)
        self._std_start = {id(p): s.start for p, s in zip(self.params, self.flat.slots)}
        self._empty = np.empty(0, dtype=dtype)
        self._worker = CommWorker(self.rank, inline=self.world == 1)
        self.units = self._build_units(model, dtype)
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
        pieces = [Piece(u.shard, u.grad_shard, u.flat, u.part[0]) for u in self.units]
        self.optimizer = ShardOptimizer(cfg, pieces, comm, sharded=True,
                                        param_names=[p.name for p in self.params], ledger=self.ledger)
        self.scaler = make_scaler(cfg.precision)
        self.overlap, self.prefetch = cfg.parallel.overlap, cfg.parallel.prefetch
        outer = [u for u in self.units if u.module is model]
        blocks = [u for u in self.units if u.module is not model]
        self._forward_order = outer + blocks
        self._backward_order = outer + blocks[::-1]
        self._in_backward = False
        self._inflight: list = []  # gradient buffers being reduced (at most two)
        self.comm_wait_s = 0.0
        self._events: list = []
        self._removers = [p.register_grad_ready_hook(self._on_grad_ready) for p in self.params]
        for u in self.units:
            pre, post = (lambda m, u=u: self._pre(u)), (lambda m, out, u=u: self._post(u, out))
            u.module.forward_pre_hooks.append(pre)
            u.module.forward_post_hooks.append(post)
            self._removers += [lambda m=u.module, f=pre: m.forward_pre_hooks.remove(f),
                               lambda m=u.module, f=post: m.forward_post_hooks.remove(f)]

    def _build_units(self, model, dtype) -> list[_Unit]:
        """Shard every unit: pack it (padded to N), start from rank 0's values, keep part r, free it."""
        modules = list(getattr(model, "blocks", None) or getattr(model, "layers", None) or [])
        groups = [(m, m.parameters()) for m in modules]
        inside = {id(p) for _, ps in groups for p in ps}
        outer = [p for p in self.params if id(p) not in inside]
        if outer:
            groups.insert(0, (model, outer))
        units = []
        for module, params in groups:
            flat = FlatBuffer(params, dtype=dtype, pad_to=self.world, grad=False)
            if self.world > 1:
                broadcast(self.comm, flat.data, root=0)
            lo, hi = part(0, flat.size, self.rank, self.world)
            units.append(_Unit(module, params, flat, (lo, hi), flat.data[lo:hi].copy(), None))
            for p in params:
                p.data = self._empty
            flat.data = self._empty
        return units

    @property
    def loss_scale(self) -> float:
        return self.scaler.scale

    @property
    def bytes_sent(self) -> int:
        return self.comm.meter.bytes_sent() if self.comm.meter is not None else 0

    # ------------------------------------------------------------------ gathering and freeing

    def _start_gather(self, u: _Unit) -> None:
        buf = np.empty(u.flat.size, dtype=u.shard.dtype)
        self.ledger.add("parameters", buf.nbytes)
        buf[u.part[0]:u.part[1]] = u.shard
        u.flat.data = buf
        u.job = self._worker.submit(lambda: all_gather(self.comm, buf))
        u.state = "pending"

    def _ensure(self, u: _Unit, pin: bool) -> None:
        if u.state == "free":
            self._start_gather(u)
        if u.state == "pending":
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
        scale = self.scaler.scale * factor
        self._in_backward = True
        try:
            (loss * scale if scale != 1.0 else loss).backward()
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
        self.comm_wait_s += self._worker.throttle(self._inflight, 2)  # at most two buffers in flight
        buf = np.zeros(u.flat.size, dtype=u.shard.dtype)
        self.ledger.add("comm_buffers", buf.nbytes)
        for i, p in enumerate(u.params):
            if p.grad is not None:
                u.flat.view(buf, i)[...] = p.grad
                self.ledger.sub("gradients", p.grad.nbytes)
                p.grad = None
        (lo, hi), shard = u.part, u.grad_shard

        def reduce_into_shard() -> None:
            reduce_scatter(self.comm, buf, op="avg")
            np.add(shard, buf[lo:hi], out=shard)
            self.ledger.sub("comm_buffers", buf.nbytes)
        self._inflight.append(self._worker.submit(reduce_into_shard))
        if not self.overlap:
            self.comm_wait_s += self._worker.throttle(self._inflight, 1)
        u.reduced = True
        self._free(u)  # every use of these parameters in this backward is behind us

    def finish_backward(self) -> None:
        t0 = time.perf_counter()
        self._worker.wait_all()
        self._inflight.clear()
        self.comm_wait_s += time.perf_counter() - t0

    def grad_norm(self) -> float:
        return self.optimizer.grad_norm(self.scaler.scale)

    # ------------------------------------------------------------------ update

    def step(self, lr: float, clip: float, step: int) -> bool:
        """Overflow check (MAX over ranks), then update the owned parts; the next forward gathers them."""
        found = self.optimizer.find_overflow(self.scaler)
        scale = self.scaler.scale
        change = self.scaler.update(step, found)
        if change is not None:
            self._events.append(change)
        if found is not None:
            return False
        self.optimizer.update(lr, clip, scale)
        return True

    def drain_events(self) -> list:
        out, self._events = self._events, []
        return out

    def close(self) -> None:
        for remove in self._removers:
            remove()
        self._worker.close()

    # ------------------------------------------------------------------ checkpoint state

    def owned_range(self) -> tuple[int, int]:
        """This rank's equal, contiguous share of the standard padded layout, as checkpoints store it."""
        n = self.flat.size // self.world
        return self.rank * n, (self.rank + 1) * n

    def optimizer_state(self) -> dict:
        """Master, m, v over owned_range() and the step. Collective: each unit's parts are all-gathered
        (one unit and one kind at a time) and every rank keeps what falls in its range."""
        local = self.optimizer.local_state()
        start, end = self.owned_range()
        out = {"step": local["step"]}
        for key in ("master", "m", "v"):
            out[key] = np.zeros(end - start, dtype=local[key].dtype)
            for u, (a, b) in zip(self.units, self.optimizer.bounds):
                tmp = np.zeros(u.flat.size, dtype=local[key].dtype)
                self.ledger.add("temporaries", tmp.nbytes)
                tmp[u.part[0]:u.part[1]] = local[key][a:b]
                all_gather(self.comm, tmp)
                for p, slot in zip(u.params, u.flat.slots):
                    std = self._std_start[id(p)]
                    x, y = max(start, std), min(end, std + slot.end - slot.start)
                    if x < y:
                        out[key][x - start:y - start] = tmp[slot.start + x - std:slot.start + y - std]
                self.ledger.sub("temporaries", tmp.nbytes)
        return out

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
