"""Distributed data parallelism (ZeRO stage 0): every rank holds everything, gradients are averaged.

Parameters and gradients live in one flat buffer each (engine.flat), so a gradient bucket is a
slice. Buckets (`bucket_cap_mb`) run in reverse parameter order, roughly the order backward
produces gradients; when the last gradient of a bucket is ready its all-reduce is handed to this
rank's communication thread and runs while backward continues. Buckets are issued strictly in
index order, so every rank issues the same collectives in the same order. With gradient
accumulation only the last micro-batch synchronises (like PyTorch's `no_sync`).

The optimizer side (overflow check, grad norm, AdamW, and in mixed precision the fp32 master, with
an fp32 gradient that exists only during the update) is engine.zero_shard, shared with ZeRO 1-3:
here it owns one piece, the whole buffer.

`NaiveDataParallel` is the teaching version: one all-reduce of the whole buffer after backward.
"""

from __future__ import annotations

import time

from engine.amp import make_scaler
from engine.comm.collectives import all_reduce, broadcast
from engine.flat import FlatBuffer
from engine.zero_comm import CommWorker, rank_ledger
from engine.zero_shard import Piece, ShardOptimizer


class DataParallel:
    """Replicated parameters, gradients and optimizer state; bucketed, overlapped all-reduce."""

    def __init__(self, cfg, model, comm):
        self.comm, self.world = comm, comm.world_size
        self.ledger = rank_ledger()
        self.params = model.parameters()
        self.flat = FlatBuffer(self.params, dtype=cfg.precision.dtype)
        if self.world > 1:
            broadcast(comm, self.flat.data, root=0)  # every rank starts from rank 0's weights
        self.ledger.hold("parameters", self.flat.data.nbytes)
        self.ledger.hold("gradients", self.flat.grad.nbytes)
        self.optimizer = ShardOptimizer(cfg, [Piece(self.flat.data, self.flat.grad, self.flat, 0)], comm,
                                        sharded=False, param_names=[s.name for s in self.flat.slots],
                                        ledger=self.ledger)
        self.scaler = make_scaler(cfg.precision)
        self.overlap = cfg.parallel.overlap
        self.buckets = self.flat.buckets(int(cfg.parallel.bucket_cap_mb * 2**20))
        self._bucket_of = self.flat.bucket_map(int(cfg.parallel.bucket_cap_mb * 2**20))
        self._expected = [0] * len(self.buckets)
        for p in self.params:
            self._expected[self._bucket_of[id(p)]] += 1
        self._sync = True
        self._comm = CommWorker(comm.rank) if self.world > 1 else None
        self.comm_wait_s = 0.0
        self._events: list = []
        self._remove_hooks = [p.register_grad_ready_hook(self._on_grad_ready) for p in self.params]

    # ------------------------------------------------------------------ gradients

    @property
    def loss_scale(self) -> float:
        return self.scaler.scale

    @property
    def bytes_sent(self) -> int:
        """Payload bytes this rank sent in the current step (all phases)."""
        return self.comm.meter.bytes_sent() if self.comm.meter is not None else 0

    def zero_grad(self) -> None:
        self.flat.zero_grad()

    def begin_micro(self, sync: bool) -> None:
        """Only the micro-batch with sync=True all-reduces; earlier ones just accumulate."""
        self._sync = sync and self.world > 1
        self._ready = [0] * len(self.buckets)
        self._next = 0

    def backward(self, loss, factor: float) -> None:
        """Backpropagate loss × factor × the loss scale (the scale is 1 unless fp16 scaling is on)."""
        scale = self.scaler.scale * factor
        (loss * scale if scale != 1.0 else loss).backward()

    def _on_grad_ready(self, p) -> None:
        if not (self._sync and self.overlap):
            return
        b = self._bucket_of[id(p)]
        self._ready[b] += 1
        while self._next < len(self.buckets) and self._ready[self._next] == self._expected[self._next]:
            self._launch(self._next)

    def _launch(self, b: int) -> None:
        bucket = self.flat.grad[slice(*self.buckets[b])]
        self._comm.submit(lambda: all_reduce(self.comm, bucket, op="avg"))
        self._next = b + 1

    def finish_backward(self) -> None:
        """Issue the buckets not yet issued (unused parameters, overlap off), wait for all of them.
        The gradients stay scaled by the loss scale; step() unscales them."""
        self.comm_wait_s = 0.0
        if not self._sync:
            return
        while self._next < len(self.buckets):
            self._launch(self._next)
        t0 = time.perf_counter()
        self._comm.wait_all()
        self.comm_wait_s = time.perf_counter() - t0

    def grad_norm(self) -> float:
        """Global unscaled gradient norm."""
        return self.optimizer.grad_norm(self.scaler.scale)

    # ------------------------------------------------------------------ update

    def step(self, lr: float, clip: float, step: int) -> bool:
        """Apply the update unless the gradients overflowed; False means the step was skipped (the
        parameters, moments, optimizer step count and, since the trainer then keeps its step, the LR
        schedule stay exactly as they were)."""
        found = self.optimizer.find_overflow(self.scaler)
        scale = self.scaler.scale  # the scale this step's gradients carry
        change = self.scaler.update(step, found)
        if change is not None:
            self._events.append(change)
        if found is not None:
            return False
        self.optimizer.update(lr, clip, scale)
        return True

    # ------------------------------------------------------------------ checkpoint state

    def owned_range(self) -> tuple[int, int]:
        """Elements of the flat fp32 state this rank owns: all of them (DDP replicates everything)."""
        return 0, self.flat.numel

    def optimizer_state(self) -> dict:
        """fp32 copies of master (the parameters outside mixed precision), m, v over owned_range()."""
        state = self.optimizer.local_state()
        return {k: (v[:self.flat.numel] if k != "step" else v) for k, v in state.items()}

    def load_optimizer_state(self, full: dict) -> None:
        """Set master, m, v, step and the model-dtype parameters from unpadded full-length arrays."""
        self.optimizer.load_local(full["master"], full["m"], full["v"], full["step"])

    def drain_events(self) -> list:
        out, self._events = self._events, []
        return out

    def close(self) -> None:
        for remove in self._remove_hooks:
            remove()
        if self._comm is not None:
            self._comm.close()


class NaiveDataParallel(DataParallel):
    """No buckets, no overlap: after backward, one all-reduce of the whole gradient buffer."""

    def _on_grad_ready(self, p) -> None:
        pass

    def finish_backward(self) -> None:
        t0 = time.perf_counter()
        if self._sync:
            all_reduce(self.comm, self.flat.grad, op="avg")
        self.comm_wait_s = time.perf_counter() - t0
